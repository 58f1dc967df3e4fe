"""The model side of a Scheduler: KV pools built once, the model over them, its worker."""

from __future__ import annotations

from radixserve.config import EngineConfig
from radixserve.models.numerics import cpu_kernels_for
from radixserve.runtime.kv_layout import KVLayout
from radixserve.runtime.kv_manager import KVManager
from radixserve.runtime.model_runner import ModelRunner
from radixserve.runtime.model_worker import ModelWorker
from radixserve.runtime.tp_ranks import TensorParallelRanks
from radixserve.runtime.tp_worker import run_tp_worker


def build_model_worker(
    config: EngineConfig, kv: KVManager | None = None
) -> tuple[KVManager, ModelWorker]:
    """The KVManager (``kv``, or one built from the model's layout) and a ModelWorker running
    the model over its pools; with ``tp_size > 1`` the other ranks start now and load their
    slices beside this one (and are stopped again if loading fails here)."""
    cpu_kernels = cpu_kernels_for(config)  # the dtype of pools and model depends on it
    kv = kv or KVManager.build(config, KVLayout.from_config(config, cpu_kernels))
    assert kv.kv_cache is not None, "a model worker needs the KV buffers"
    ranks = (
        TensorParallelRanks.start(config, run_tp_worker) if config.parallel.tp_size > 1 else None
    )
    try:
        runner = ModelRunner(config, kv.kv_cache, kv.req_to_token_pool, cpu_kernels, tp_ranks=ranks)
    except BaseException:
        if ranks is not None:
            ranks.shutdown()
        raise
    overlap = not config.execution.disable_overlap_schedule
    return kv, ModelWorker(
        runner,
        config.admission.max_running_requests,
        overlap=overlap,
        launch=config.execution.overlap_launch,
    )
