from types import SimpleNamespace

from specbuild.workflow.allocation import batch_step, keep_going


def test_only_a_cluster_jobs_own_snakemake_in_its_batch_step_is_the_allocations(monkeypatch):
    remote, main = SimpleNamespace(remote_exec=True), SimpleNamespace(remote_exec=False)
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert not batch_step(remote)  # no allocation
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert batch_step(remote)
    assert not batch_step(main)  # a run started inside an allocation (salloc) is no job's
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    assert not batch_step(remote)  # one job, in its step


def test_the_allocations_snakemake_keeps_going_once_its_settings_exist():
    seen = []
    workflow = SimpleNamespace(execution_settings=None)
    workflow.execute = lambda *a, **kw: seen.append((workflow.execution_settings.keep_going, a))
    keep_going(workflow)  # at parse time: no settings yet
    workflow.execution_settings = SimpleNamespace(keep_going=False)
    workflow.execute(1, x=2)
    assert seen == [(True, (1,))]
