"""CostModel: what one batch of the model costs, in seconds, as a few fitted coefficients.

An EXTEND (prefill) step of requests ``i`` computing ``n_i`` new tokens over ``c_i`` cached ones::

    t = prefill_base + prefill_per_req * bs + prefill_per_token * sum n_i
        + prefill_per_attn * sum n_i * (c_i + (n_i + 1) / 2)

(the last term: each new token attends to its cached context and to the new tokens before it).
A DECODE step of ``b`` requests at context lengths ``s_i``::

    t = decode_base + decode_per_req * b + decode_per_ctx * sum s_i

The coefficients come from ``radixserve sim calibrate`` (least squares over steps measured on
the real runtime, :func:`fit`), or from a device's FLOP/s and memory bandwidth
(:func:`from_roofline`, derived in ``docs/sim_cost_model.md``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PREFILL_TERMS = ("prefill_base", "prefill_per_req", "prefill_per_token", "prefill_per_attn")
DECODE_TERMS = ("decode_base", "decode_per_req", "decode_per_ctx")
BUILTIN_DIR = Path(__file__).parent / "costs"


@dataclass(frozen=True, slots=True)
class CostModel:
    prefill_base: float = 0.0
    prefill_per_req: float = 0.0
    prefill_per_token: float = 0.0
    prefill_per_attn: float = 0.0
    decode_base: float = 0.0
    decode_per_req: float = 0.0
    decode_per_ctx: float = 0.0
    # where the coefficients came from (model, device, load at calibration, fit residuals)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in (*PREFILL_TERMS, *DECODE_TERMS):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"cost model {name} must be a number >= 0, got {value!r}")

    def prefill_s(self, extend_lens: Sequence[int], prefix_lens: Sequence[int]) -> float:
        n_tok = 0
        attn = 0.0
        for n, c in zip(extend_lens, prefix_lens, strict=True):
            n_tok += n
            attn += n * (c + (n + 1) / 2)
        return (
            self.prefill_base
            + self.prefill_per_req * len(extend_lens)
            + self.prefill_per_token * n_tok
            + self.prefill_per_attn * attn
        )

    def decode_s(self, seq_lens: Sequence[int]) -> float:
        return (
            self.decode_base
            + self.decode_per_req * len(seq_lens)
            + self.decode_per_ctx * sum(seq_lens)
        )

    # ---- files ----------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        known = set(PREFILL_TERMS) | set(DECODE_TERMS) | {"meta"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown cost model fields {sorted(unknown)}")
        return cls(**data)

    @classmethod
    def load(cls, name_or_path: str | Path) -> CostModel:
        """A JSON file, or the name of a built-in one (``radixserve/sim/costs/NAME.json``)."""
        path = Path(name_or_path)
        if not path.is_file():
            path = BUILTIN_DIR / f"{name_or_path}.json"
        if not path.is_file():
            builtin = sorted(p.stem for p in BUILTIN_DIR.glob("*.json"))
            raise ValueError(f"no cost model file {name_or_path!r} (built-in: {builtin})")
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None


def prefill_features(extend_lens: Sequence[int], prefix_lens: Sequence[int]) -> list[float]:
    attn = sum(n * (c + (n + 1) / 2) for n, c in zip(extend_lens, prefix_lens, strict=True))
    return [1.0, float(len(extend_lens)), float(sum(extend_lens)), attn]


def decode_features(seq_lens: Sequence[int]) -> list[float]:
    return [1.0, float(len(seq_lens)), float(sum(seq_lens))]


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (a cost never goes down with more work): drop
    the most negative coefficient and refit until none is negative (few terms: exact enough).
    Rows are weighted by 1/y, so a short step's relative error counts as much as a long one's."""
    w = 1.0 / np.maximum(y, 1e-9)
    aw, yw = a * w[:, None], y * w
    active = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(aw[:, active], yw, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0.0
            coef[active] = sol
            return coef
        active.pop(int(np.argmin(sol)))
    return coef


def fit(
    prefill_points: Sequence[tuple[Sequence[int], Sequence[int], float]],
    decode_points: Sequence[tuple[Sequence[int], float]],
    meta: dict[str, Any] | None = None,
) -> CostModel:
    """Fit a cost model to measured steps: prefill ``(extend_lens, prefix_lens, seconds)`` and
    decode ``(seq_lens, seconds)``. Needs at least as many points as terms of each kind."""
    if len(prefill_points) < len(PREFILL_TERMS) or len(decode_points) < len(DECODE_TERMS):
        raise ValueError(
            f"fit needs >= {len(PREFILL_TERMS)} prefill and >= {len(DECODE_TERMS)} decode points"
        )
    pa = np.array([prefill_features(e, p) for e, p, _ in prefill_points])
    py = np.array([t for *_, t in prefill_points])
    da = np.array([decode_features(s) for s, _ in decode_points])
    dy = np.array([t for _, t in decode_points])
    pc, dc = nnls(pa, py), nnls(da, dy)
    info = dict(meta or {})
    info["fit_rel_err"] = {
        "prefill_max": float(np.max(np.abs(pa @ pc - py) / py)),
        "decode_max": float(np.max(np.abs(da @ dc - dy) / dy)),
    }
    values = dict(zip(PREFILL_TERMS, map(float, pc), strict=True))
    values.update(zip(DECODE_TERMS, map(float, dc), strict=True))
    return CostModel(**values, meta=info)


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """A device for :func:`from_roofline`: peak dense FLOP/s and memory bytes/s, the fractions
    of them a real kernel reaches, and a fixed per-step overhead (launches, scheduling)."""

    name: str
    flops: float
    bandwidth: float
    flops_efficiency: float = 0.5
    bandwidth_efficiency: float = 0.7
    step_overhead_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the roofline needs of a decoder: parameters, and the K/V bytes of one token."""

    name: str
    num_params: float
    num_layers: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    num_heads: int
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


QWEN25_05B = ModelShape("qwen2.5-0.5b", 494e6, 24, 896, 2, 64, 14)
H100_SXM = DeviceSpec("h100-sxm-bf16", flops=989e12, bandwidth=3.35e12, step_overhead_s=1e-3)


def from_roofline(model: ModelShape, device: DeviceSpec) -> CostModel:
    """A cost model from first principles (see ``docs/sim_cost_model.md``): a prefill token
    costs ``2 * params`` FLOPs plus attention ``4 * layers * heads * head_dim`` per context
    token; a decode step streams the weights once and each request's K/V, whichever of that
    and the FLOPs is slower (here: bytes, for batches below ~100 requests on an H100)."""
    flops = device.flops * device.flops_efficiency
    bw = device.bandwidth * device.bandwidth_efficiency
    weight_bytes = model.num_params * model.dtype_bytes
    attn_flops = 4 * model.num_layers * model.num_heads * model.head_dim
    return CostModel(
        prefill_base=device.step_overhead_s + weight_bytes / bw,
        prefill_per_token=2 * model.num_params / flops,
        prefill_per_attn=attn_flops / flops,
        decode_base=device.step_overhead_s + weight_bytes / bw,
        decode_per_req=2 * model.num_params / flops,
        decode_per_ctx=model.kv_bytes_per_token / bw,
        meta={"source": "roofline", "model": asdict(model), "device": asdict(device)},
    )
