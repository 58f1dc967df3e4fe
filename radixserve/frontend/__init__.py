"""radixserve's frontend: a Python language for LLM programs over shared prefixes (SGLang's).

::

    from radixserve.frontend import function, gen, select, system, user, assistant, Runtime

    @function
    def qa(s, question):
        s += system("You are terse.")
        s += user(question)
        s += assistant(gen("answer", max_tokens=64))

    state = qa.run(question="Why radix trees?", backend=Runtime("path/to/model"))
    print(state["answer"])

Imports neither torch nor :mod:`radixserve.runtime`: the ``Runtime`` backend loads the engine
when it is created. See ``README.md`` beside this file for the semantics and the cache behaviour.
"""

from __future__ import annotations

from radixserve.frontend.backends import (
    Backend,
    Runtime,
    RuntimeEndpoint,
    get_default_backend,
    set_default_backend,
)
from radixserve.frontend.chat_template import ChatTemplate
from radixserve.frontend.errors import BackendError, ProgramError
from radixserve.frontend.ir import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from radixserve.frontend.program import Program, function
from radixserve.frontend.select_methods import SELECT_METHODS
from radixserve.frontend.state import ForkGroup, ProgramState

__all__ = [
    "SELECT_METHODS",
    "Backend",
    "BackendError",
    "ChatTemplate",
    "ForkGroup",
    "Program",
    "ProgramError",
    "ProgramState",
    "Runtime",
    "RuntimeEndpoint",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_default_backend",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "user",
    "user_begin",
    "user_end",
]
