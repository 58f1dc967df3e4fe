import sys

from radixserve.bench.cli import main

sys.exit(main())
