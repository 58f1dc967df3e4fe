import sys

from radixserve.api.cli import main

sys.exit(main())
