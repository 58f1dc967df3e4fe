"""Jump-forward: a request whose grammar forces its next tokens takes them all at once."""

from __future__ import annotations

from radixserve.types import Req


def jump_forward(req: Req, max_context_len: int) -> int:
    """Append ``req``'s pending forced tokens to its output (its grammar accepts them), as many
    as its length budget allows; how many. Their KV is computed by the next extend step (the
    scheduler's running extend: ``seq_len - kv_len`` tokens each).

    Not for requests that want logprobs (a forced token has none) or have stop strings (the
    judge looks for them in the newest token's text)."""
    grammar = req.grammar
    if grammar is None or not grammar.forced or req.return_logprob or req.sampling_params.stop:
        return 0
    limit = min(req.remaining_new_tokens(), max_context_len - req.seq_len)
    tokens = grammar.take_forced(limit)
    for token in tokens:
        req.append_output(token)
    return len(tokens)
