"""``--dp-size`` argument handling, without starting anything."""

from __future__ import annotations

import pytest

from radixserve.config import EngineConfig, ServerConfig
from radixserve.launch import cli, data_parallel


def test_dp_size_without_the_router_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(data_parallel, "_installed", lambda router: False)
    assert cli.main(["serve", "--dp-size", "2"]) == 2
    assert "pip install 'radixserve[router]'" in capsys.readouterr().err
    # a router named but not installed, the other one installed: the same exit, not a traceback
    monkeypatch.setattr(data_parallel, "_installed", lambda router: router == "sglang-router")
    assert cli.main(["serve", "--dp-size", "2", "--router", "smg"]) == 2
    assert "--router smg is not installed" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dp-size", "0"], "--dp-size must be >= 1"),
        (["--dp-size", "2", "--threads-per-worker", "0"], "--threads-per-worker must be >= 1"),
    ],
)
def test_bad_dp_arguments_are_rejected(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


def test_router_command_puts_the_router_on_the_public_address() -> None:
    config = ServerConfig(
        engine=EngineConfig(model_path="/m"), host="0.0.0.0", port=8000, log_level="warning"
    )
    dp = data_parallel.DataParallelConfig(
        2, "round_robin", None, ("--balance-abs-threshold=8",), "sglang-router"
    )
    cmd = data_parallel.router_command(config, dp, ["http://127.0.0.1:1", "http://127.0.0.1:2"])
    assert cmd[1:3] == ["-m", "sglang_router.launch_router"]
    joined = " ".join(cmd)
    assert "--host 0.0.0.0 --port 8000 --policy round_robin" in joined
    assert "--worker-urls http://127.0.0.1:1 http://127.0.0.1:2" in joined
    assert "--log-level warn" in joined and cmd[-1] == "--balance-abs-threshold=8"
    assert len(set(data_parallel.free_ports(4))) == 4


def test_each_worker_gets_a_file_tier_of_its_own(tmp_path, tiny_llama_dir) -> None:
    """Two workers mapping one tier file would overwrite each other's KV: each gets its own."""
    import torch

    from radixserve.memory_pool.kv_tier import TierLayout, file_tier

    argv = ["serve", "--model", str(tiny_llama_dir), "--dp-size", "2"]
    argv += ["--kv-tier-path", str(tmp_path)]
    config = cli.make_server_config(cli.build_parser().parse_args(argv))
    workers = data_parallel.worker_server_configs(config, 1, [1001, 1002])
    paths = [w.engine.kv_tier.kv_tier_path for w in workers]
    assert [w.port for w in workers] == [1001, 1002] and all(
        w.engine.execution.num_threads == 1 for w in workers
    )
    assert len(set(paths)) == 2 and all(
        p is not None and p.startswith(str(tmp_path)) for p in paths
    )
    layout = TierLayout(1, 1, 4, "torch.float32", 1)
    tiers = [file_tier(p, layout, 8, "model")[0] for p in paths if p is not None]
    tiers[0].storage.fill_(1.0)
    assert torch.count_nonzero(tiers[1].storage) == 0  # worker 1's KV is untouched


def test_each_worker_publishes_kv_events_on_its_own_ports(tiny_llama_dir) -> None:
    """SGLang's ports: the endpoints' plus the worker's rank, which its batches carry."""
    config = '{"publisher": "zmq", "endpoint": "tcp://*:6000", "replay_endpoint": "tcp://*:6100"}'
    argv = ["serve", "--model", str(tiny_llama_dir), "--dp-size", "3"]
    server = cli.make_server_config(
        cli.build_parser().parse_args([*argv, "--kv-events-config", config])
    )
    workers = data_parallel.worker_server_configs(server, 1, [1001, 1002, 1003])
    events = [w.engine.kv_events for w in workers]
    assert [(e.endpoint, e.replay_endpoint) for e in events if e is not None] == [
        (f"tcp://*:{6000 + i}", f"tcp://*:{6100 + i}") for i in range(3)
    ]
    assert [w.engine.parallel.dp_rank for w in workers] == [0, 1, 2]


def test_the_router_gets_a_free_metrics_port_unless_one_is_given() -> None:
    config = ServerConfig(engine=EngineConfig(model_path="/m"), port=8000)
    urls = ["http://127.0.0.1:1"]
    cmd = data_parallel.router_command(config, data_parallel.DataParallelConfig(2), urls)
    port = int(cmd[cmd.index("--prometheus-port") + 1])
    assert port != 29000 and 0 < port < 65536  # not the router's fixed default
    given = data_parallel.DataParallelConfig(2, router_args=("--prometheus-port=9100",))
    cmd = data_parallel.router_command(config, given, urls)
    assert cmd.count("--prometheus-port") == 0 and cmd[-1] == "--prometheus-port=9100"
    # health checks every 5 s, 2 failures: a dead worker leaves rotation in about 10 s
    assert cmd[cmd.index("--health-check-interval-secs") + 1] == "5"
    slow = data_parallel.DataParallelConfig(2, router_args=("--health-failure-threshold=9",))
    cmd = data_parallel.router_command(config, slow, urls)
    assert "--health-failure-threshold" not in cmd and "--health-check-interval-secs" in cmd


def test_the_gateway_is_smg_where_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """auto: smg (SGLang's model gateway) where it is installed, else sglang-router; a router
    that is not installed is named in the error with the install hint."""
    installed = {"smg": True, "sglang-router": True}
    monkeypatch.setattr(data_parallel, "_installed", lambda r: installed[r])
    config = ServerConfig(engine=EngineConfig(model_path="/m"), port=8000)
    cmd = data_parallel.router_command(
        config, data_parallel.DataParallelConfig(2), ["http://127.0.0.1:1"]
    )
    assert cmd[1:3] == ["-m", "smg.launch_router"] and "--prometheus-port" in cmd
    assert data_parallel.resolve_router("sglang-router") == "sglang-router"
    installed["smg"] = False
    assert data_parallel.resolve_router("auto") == "sglang-router"
    with pytest.raises(ValueError, match="--router smg is not installed"):
        data_parallel.resolve_router("smg")
    installed["sglang-router"] = False  # neither: auto names no router, with the hint
    with pytest.raises(ValueError, match="--router auto is not installed"):
        data_parallel.resolve_router("auto")


def test_router_choice_is_an_argument(capsys: pytest.CaptureFixture[str]) -> None:
    args = cli.build_parser().parse_args(["serve", "--dp-size", "2", "--router", "smg"])
    assert data_parallel.from_args(args).router == "smg"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--router", "nginx"])
    assert "invalid choice" in capsys.readouterr().err
