"""When the overlap loop must wait: the scheduler plans batch N+1 while batch N runs, unless
something N+1 needs is only known once N's results are processed."""

from __future__ import annotations

from radixserve.runtime.schedule_batch import ScheduleBatch


def must_wait(
    in_flight: ScheduleBatch,
    *,
    waiting: bool,
    chunked: bool,
    spec: bool,
    mixed_chunk: bool,
    write_through: bool,
) -> bool:
    """Whether to process ``in_flight`` before planning the next batch:

    - its tokens decide the next step's input: a grammar's next mask, the next drafts (``spec``:
      where the next step could draft, ``SpecDecoder.may_draft``; a step that cannot is a plain
      decode, and the scheduler proposes no drafts while a step is in flight);
    - a prefill in flight caches its prompts when processed: requests ``waiting`` can then
      match them (overlap resumes with the next decode);
    - a mixed prefill (``mixed_chunk``) needs the running requests' last tokens on the host;
    - a KV tier that writes through copies what is cached: the ``chunked`` request's chunk in
      flight first.
    """
    if spec or in_flight.has_grammar:
        return True
    if waiting and not in_flight.is_decode:
        return True
    if mixed_chunk and (waiting or chunked):
        return True
    return chunked and write_through
