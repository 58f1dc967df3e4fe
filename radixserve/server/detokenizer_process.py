"""The detokenizer process: PULL from the scheduler, :class:`Detokenizer`, PUSH to HTTP."""

from __future__ import annotations

import logging
import traceback
from multiprocessing.connection import Connection

import zmq

from radixserve.server.detokenizer import Detokenizer
from radixserve.server.ipc import (
    IpcEndpoints,
    ParentWatch,
    exit_process,
    make_socket,
    recv_all,
    setup_child_process,
)
from radixserve.tokenizer_loader import JsonDecoder, load_tokenizer

logger = logging.getLogger(__name__)

IDLE_POLL_MS = 1000


def run_detokenizer_process(
    tokenizer_path: str,
    decoder: str | None,
    endpoints: IpcEndpoints,
    ready: Connection,
    parent_pid: int,
    log_level: str = "info",
) -> None:
    """Process entry point. Sends ``"ready"`` (or an error string) through ``ready`` once the
    tokenizer is loaded, then runs until the parent goes away or SIGTERM. ``decoder``: the
    server's tokenizer as :func:`~radixserve.tokenizer_loader.decoder_json` gives it, decoded
    without transformers; ``None``: the tokenizer at ``tokenizer_path``, loaded here."""
    setup_child_process(log_level)
    try:
        detokenizer = Detokenizer(
            JsonDecoder(decoder) if decoder is not None else load_tokenizer(tokenizer_path)
        )
    except Exception:
        ready.send(f"the detokenizer could not load the tokenizer:\n{traceback.format_exc()}")
        raise
    context = zmq.Context()
    recv = make_socket(context, zmq.PULL, endpoints.detokenizer_in, bind=True)
    send = make_socket(context, zmq.PUSH, endpoints.tokenizer_in, bind=False)
    ready.send("ready")
    ready.close()
    watch = ParentWatch(parent_pid)
    logger.info("detokenizer ready")
    code = 0
    try:
        while not watch.parent_gone():
            msgs = recv_all(recv, IDLE_POLL_MS)
            if msgs:
                results = detokenizer.handle(msgs)
                if results:
                    send.send_pyobj(results)
        logger.warning("the server process is gone; the detokenizer exits")
        endpoints.remove_dir()
    except SystemExit:
        logger.info("detokenizer stopping")
    except BaseException:
        logger.exception("the detokenizer crashed")
        code = 1
    exit_process(code)
