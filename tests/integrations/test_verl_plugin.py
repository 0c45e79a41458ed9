"""The plugin registers Conduit's trainers through verl's own extension points: entry point, env var, Ray worker."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")


def test_version_gate_names_what_is_installed_and_what_was_tested(monkeypatch) -> None:
    from conduit.integrations.verl import compat

    assert compat.check_versions()["verl"] == "0.9.1"
    monkeypatch.setitem(compat.TESTED, "verl", ("0.0.1",))
    with pytest.raises(compat.UntestedVersion, match=r"verl 0\.9\.1 is installed.*0\.0\.1.*\.\[verl\]"):
        compat.check_versions()
    monkeypatch.setenv(compat.ALLOW_ENV, "1")
    with pytest.warns(RuntimeWarning):
        compat.check_versions()


def test_import_contract_of_the_hooks_the_adapter_overrides() -> None:
    import inspect

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.v1 import PPOTrainer

    for name in (
        "_step_once",
        "_balance_batch",
        "_compute_reward_colocate",
        "_compute_old_log_prob",
        "_compute_ref_log_prob",
        "_compute_values",
        "_compute_advantage",
        "_update_actor",
    ):
        assert "metrics" in inspect.signature(getattr(PPOTrainer, name)).parameters, name
    for name in ("_compute_old_log_prob", "_compute_ref_log_prob", "_compute_values"):
        assert list(inspect.signature(getattr(RayPPOTrainer, name)).parameters) == ["self", "batch"], name


def test_entry_point_registers_the_trainers_when_verl_is_imported(tmp_path) -> None:
    """A ``verl.plugins`` entry point (as the extra installs it) loads the plugin inside ``import verl``."""
    dist = tmp_path / "conduit_verl_probe-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: conduit-verl-probe\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[verl.plugins]\nconduit = conduit.integrations.verl.plugin\n")
    code = textwrap.dedent("""
        import sys, verl
        assert "conduit.integrations.verl.plugin" in sys.modules, "entry point not loaded"
        assert "conduit.integrations.verl.v1" not in sys.modules, "the plugin imported the trainers eagerly"
        from verl.trainer.ppo.v1 import get_trainer_cls
        from conduit.integrations.verl import status
        print(get_trainer_cls("conduit_sync").__name__, get_trainer_cls("conduit_separate_async").__name__,
              status()["registered"])
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env.pop("VERL_USE_EXTERNAL_MODULES", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ConduitPPOTrainerSync ConduitPPOTrainerSeparateAsync ['conduit_sync', 'conduit_separate_async']" in (
        out.stdout
    )


def test_registered_in_the_driver_and_inside_a_ray_worker(ray_session) -> None:
    from conduit.integrations.verl.plugin import register
    from verl.trainer.ppo.v1 import get_trainer_cls

    assert register() == ["conduit_sync", "conduit_separate_async"]
    assert get_trainer_cls("conduit_sync").__name__ == "ConduitPPOTrainerSync"

    @ray_session.remote(
        num_cpus=0, runtime_env={"env_vars": {"VERL_USE_EXTERNAL_MODULES": "conduit.integrations.verl.plugin"}}
    )
    def in_worker() -> str:
        import verl  # noqa: F401  (verl imports the plugin module named in VERL_USE_EXTERNAL_MODULES)
        from verl.trainer.ppo.v1 import get_trainer_cls

        return get_trainer_cls("conduit_separate_async").__name__

    assert ray_session.get(in_worker.remote(), timeout=180) == "ConduitPPOTrainerSeparateAsync"


def test_v0_trainer_overlaps_ref_with_old_log_prob_through_the_parents_methods(monkeypatch) -> None:
    import threading
    from types import SimpleNamespace

    from conduit.integrations.verl.v0 import ConduitRayPPOTrainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import Role

    calls: list[tuple[str, str]] = []
    together = threading.Barrier(2, timeout=10)  # passes only if old and ref log-prob run at the same time

    def fake(name):
        def fn(self, batch):
            calls.append((name, threading.current_thread().name))
            if batch == "B":
                together.wait()
            return f"{name}:{batch}"

        return fn

    monkeypatch.setattr(RayPPOTrainer, "_compute_old_log_prob", fake("old"))
    monkeypatch.setattr(RayPPOTrainer, "_compute_ref_log_prob", fake("ref"))
    monkeypatch.setattr(RayPPOTrainer, "_compute_values", fake("values"))
    tr = object.__new__(ConduitRayPPOTrainer)
    tr.ref_in_actor, tr.use_reference_policy, tr.use_critic = False, True, False
    tr._compute_old_log_prob("A")  # no pools known: the actor's for both, verl's order (never a guessed pool)
    assert tr.conduit_last_plan == "old_log_prob -> ref_log_prob"
    tr.conduit_pending.clear()
    tr.resource_pool_manager = SimpleNamespace(mapping={Role.ActorRollout: "actor_pool", Role.RefPolicy: "ref_pool"})
    calls.clear()
    old = tr._compute_old_log_prob("B")  # both run here, at once (else the barrier breaks)
    ref = tr._compute_ref_log_prob("B")  # fit's next call: already computed, beside the old log-prob
    assert (old, ref) == ("old:B", "ref:B")
    assert len(calls) == 2 and "(old_log_prob || ref_log_prob)" in tr.conduit_last_plan
    tr.ref_in_actor = True  # the same pool: verl's order, one at a time
    tr._compute_old_log_prob("C")
    assert tr.conduit_last_plan == "old_log_prob -> ref_log_prob"
    tr.conduit_runner.close()


def test_dapo_group_filtering_with_the_admission_sampler_is_refused_before_anything_is_built() -> None:
    """verl leaves group filtering to a custom sampler, and Conduit's does not filter: the pair is refused by name
    (it trained on unfiltered groups without a word)."""
    from conduit.integrations.verl.v1 import ConduitPPOTrainerSync
    from omegaconf import OmegaConf

    from conduit import ConfigError

    def config(enable: bool):
        return OmegaConf.create({
            "algorithm": {"filter_groups": {"enable": enable, "metric": "acc"}},
            "trainer": {"v1": {"trainer_mode": "conduit_sync", "sampler": {
                "custom_sampler": {"path": "pkg://conduit.integrations.verl.sampler", "name": "ConduitAdmissionBuffer"}}}},
        })

    with pytest.raises(ConfigError, match="filter_groups"):
        ConduitPPOTrainerSync(config(True))
    with pytest.raises(Exception) as other:  # without filtering the check passes and verl's own setup goes on
        ConduitPPOTrainerSync(config(False))
    assert not isinstance(other.value, ConfigError)
