"""What a run in its own container costs against a run in a subprocess: launch to first op, and CPU.

One job, ``marketing_execution_job`` with an empty batch (its op starts, finds nothing to take over, ends),
launched in turn through two instances that share one PostgreSQL storage and one code server:

- subprocess: deploy/dagster.yaml's default run launcher, the run worker a child process of the code server;
- container: deploy/docker/dagster.yaml's DockerRunLauncher, the run worker in a fresh container of the image
  (host network, the secrets and compute-log volumes mounted, removed as it exits), as the Docker stack runs
  every run.

Both launch at once (`dagster job launch`, the default run coordinator: no daemon, no queue), one run at a
time. Per run: launch to first op is Dagster's own event times, RUN_STARTING to STEP_START; CPU is the whole
machine's CPU seconds (/proc/stat) from the run's creation to its end and its container's removal, so the
engine's work (containerd, the storage driver copying the image in and deleting it) counts, as it does for an
operator; the next run starts only then. Printed: the medians of each side,
container / subprocess, and beside them a container of the image that runs only `true` (what the engine
costs before any Python starts).

Needs a Docker engine, the image (``--image``; build it as deploy/README.md, "The image", says) and
dagster-docker next to this Python (the [dev] extra has it).

    python benchmarks/run_container.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa
import yaml
from _common import free_port, print_table, throwaway_database
from _daemon import dagster_bin, dagster_storage_database
from dagster import DagsterEventType

from marketing_pipelines.redact import shown_text

REPO_ROOT = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")
JOB = "marketing_execution_job"
EMPTY_BATCH = {"ops": {"perform_executions": {"config": {"execution_ids": [], "claimed_by": "benchmark"}}}}
VOLUME = "marketing-secrets"  # the names deploy/docker/dagster.yaml mounts into run containers
LOG_VOLUME = "marketing-compute-logs"  # created by the engine at the first run container; removed at the end


def cpu_seconds() -> float:
    """The whole machine's busy CPU time so far (user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICKS


def instance_file(source: Path, home: Path) -> None:
    """``source`` with the default run coordinator: `dagster job launch` launches at once, no daemon."""
    instance = yaml.safe_load(source.read_text())
    instance["run_coordinator"] = {"module": "dagster.core.run_coordinator", "class": "DefaultRunCoordinator"}
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance))


def wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = subprocess.run(
            [dagster_bin("dagster"), "api", "grpc-health-check", "-p", str(port)], capture_output=True, timeout=60
        )
        if done.returncode == 0:
            return
        time.sleep(0.5)
    sys.exit(f"the code server on port {port} did not answer within {timeout:.0f} s")


def launch(kind: str, index: int, env: dict[str, str], workspace: Path, dagster: sa.Engine) -> tuple[float, float]:
    """One run launched through ``kind``'s instance: (launch to first op s, machine CPU s)."""
    tag = f"{kind}-{index}"
    argv = [dagster_bin("dagster"), "job", "launch", "-w", str(workspace), "-j", JOB]
    argv += ["--config-json", json.dumps(EMPTY_BATCH), "--tags", json.dumps({"benchmark": tag})]
    cli = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    run_id = None
    while run_id is None:
        if cli.poll() not in (None, 0):
            sys.exit(f"dagster job launch ({kind}) failed:\n{cli.stdout.read().decode()[-2000:]}")  # type: ignore[union-attr]
        with dagster.connect() as conn:
            run_id = conn.execute(
                sa.text("SELECT run_id FROM run_tags WHERE key = 'benchmark' AND value = :tag"), {"tag": tag}
            ).scalar()
        time.sleep(0.02)
    cpu_before = cpu_seconds()
    deadline = time.monotonic() + 120
    while True:
        with dagster.connect() as conn:
            status = conn.execute(sa.text("SELECT status FROM runs WHERE run_id = :r"), {"r": run_id}).scalar_one()
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        if time.monotonic() > deadline:
            sys.exit(f"run {run_id} ({kind}) still {status} after 120 s")
        time.sleep(0.1)
    cli.wait(timeout=60)
    # A run's container is removed as it exits, which is work of the engine's (a whole copy of the image
    # under the vfs storage driver): counted in the run's CPU, and over before the next run starts.
    while subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=dagster/run_id={run_id}"], capture_output=True, text=True
    ).stdout.strip():
        time.sleep(0.1)
    cpu = cpu_seconds() - cpu_before
    if status != "SUCCESS":
        with dagster.connect() as conn:
            events = conn.execute(
                sa.text("SELECT event FROM event_logs WHERE run_id = :r ORDER BY id DESC LIMIT 6"), {"r": run_id}
            ).scalars()
            # A run's messages may quote a URL or an error with a secret in it: shown as the project shows text.
            said = [shown_text(json.loads(e).get("user_message", "")[:400]) for e in events]
        sys.exit(f"run {run_id} ({kind}) ended {status}; its last events:\n" + "\n".join(reversed(said)))
    with dagster.connect() as conn:
        times = dict(
            conn.execute(
                sa.text(
                    "SELECT dagster_event_type, min(timestamp) FROM event_logs WHERE run_id = :r"
                    " AND dagster_event_type IN (:starting, 'STEP_START') GROUP BY 1"
                ),
                {"r": run_id, "starting": DagsterEventType.RUN_STARTING.value},
            ).all()
        )
    return (times["STEP_START"] - times[DagsterEventType.RUN_STARTING.value]).total_seconds(), cpu


def engine_floor(image: str) -> tuple[float, float]:
    """A container of the image that runs `true` on the host network and is removed: what the engine alone costs."""
    cpu_before, started = cpu_seconds(), time.perf_counter()
    subprocess.run(["docker", "run", "--rm", "--network", "host", image, "true"], capture_output=True, check=True)
    return time.perf_counter() - started, cpu_seconds() - cpu_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="Runs of each kind, launched in turn.")
    parser.add_argument("--image", default="marketing-pipelines:test", help="The image of deploy/container/.")
    args = parser.parse_args()
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        sys.exit("no Docker engine answers (Debian: apt-get install docker.io, then start dockerd)")
    if subprocess.run(["docker", "image", "inspect", args.image], capture_output=True).returncode != 0:
        sys.exit(f"no image {args.image}: build it (deploy/README.md, 'The image') or pass --image")
    for volume in (VOLUME, LOG_VOLUME):
        if subprocess.run(["docker", "volume", "inspect", volume], capture_output=True).returncode == 0:
            sys.exit(f"the volume {volume} exists (a Docker stack runs on this engine): stop it first")

    folder = Path(tempfile.mkdtemp(prefix="mp-run-container-"))
    folder.chmod(0o755)
    server = None
    try:
        with throwaway_database("postgres") as app_url, dagster_storage_database() as pg:
            # As the Docker stack gives them: secrets as files in the volume, every other setting by name.
            secrets_dir = folder / "secrets"
            secrets_dir.mkdir()
            for name, value in {
                "MARKETING_DATABASE_URL": app_url,
                "DAGSTER_PG_PASSWORD": pg["DAGSTER_PG_PASSWORD"],
            }.items():
                (secrets_dir / name).write_text(value)
            subprocess.run(["chown", "-R", "10001", str(secrets_dir)], capture_output=True, check=False)
            subprocess.run(
                ["docker", "volume", "create", "--driver", "local", "--opt", "type=none", "--opt", "o=bind",
                 "--opt", f"device={secrets_dir}", VOLUME],
                capture_output=True, check=True,
            )  # fmt: skip
            settings = {}
            for line in (REPO_ROOT / "deploy" / "docker" / "settings.env").read_text().splitlines():
                if line and not line.startswith("#"):
                    name, _, value = line.partition("=")
                    settings[name] = value
            base = {k: v for k, v in os.environ.items() if not k.startswith(("MARKETING_", "DAGSTER_"))}
            env = {**base, **settings, **pg, "MARKETING_DATABASE_URL": app_url, "DAGSTER_CURRENT_IMAGE": args.image}
            homes = {"subprocess": folder / "subprocess", "container": folder / "container"}
            instance_file(REPO_ROOT / "deploy" / "dagster.yaml", homes["subprocess"])
            instance_file(REPO_ROOT / "deploy" / "docker" / "dagster.yaml", homes["container"])
            migrate_env = {**env, "DAGSTER_HOME": str(homes["subprocess"])}
            subprocess.run(
                [dagster_bin("dagster"), "instance", "migrate"], env=migrate_env, capture_output=True, check=True
            )

            port = free_port()
            workspace = folder / "workspace.yaml"
            location = {"host": "127.0.0.1", "port": port, "location_name": "marketing_pipelines"}
            workspace.write_text(yaml.safe_dump({"load_from": [{"grpc_server": location}]}))
            code_server = ["dagster", "api", "grpc", "-m", "marketing_pipelines.definitions", "-p", str(port)]
            server = subprocess.Popen(
                [dagster_bin(code_server[0]), *code_server[1:]],
                env={**env, "DAGSTER_HOME": str(homes["subprocess"])},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            wait_for_port(port, 120)
            dagster = sa.create_engine(
                sa.engine.URL.create(
                    "postgresql+psycopg2", username=pg["DAGSTER_PG_USER"], password=pg["DAGSTER_PG_PASSWORD"] or None,
                    host=pg["DAGSTER_PG_HOST"], port=int(pg["DAGSTER_PG_PORT"]), database=pg["DAGSTER_PG_DB"],
                )
            )  # fmt: skip
            results: dict[str, list[tuple[float, float]]] = {"subprocess": [], "container": []}
            floor: list[tuple[float, float]] = []
            for index in range(args.rounds):
                for kind, home in homes.items():
                    results[kind].append(launch(kind, index, {**env, "DAGSTER_HOME": str(home)}, workspace, dagster))
                floor.append(engine_floor(args.image))
            dagster.dispose()
    finally:
        # The last run's container may still be being removed, and holds the volumes until it is.
        deadline = time.monotonic() + 60
        for volume in (VOLUME, LOG_VOLUME):
            while subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True).returncode != 0:
                if time.monotonic() > deadline:
                    print(f"the volume {volume} is still in use: remove it with `docker volume rm {volume}`")
                    break
                time.sleep(1)
        if server is not None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)

    start = {kind: statistics.median(s for s, _ in runs) for kind, runs in results.items()}
    cpu = {kind: statistics.median(c for _, c in runs) for kind, runs in results.items()}
    print_table(
        f"One run of {JOB} (empty batch), medians of {args.rounds} of each, launched in turn, one at a time",
        ["launcher", "launch to first op (s)", "machine CPU (s)"],
        [
            *((kind, start[kind], cpu[kind]) for kind in results),
            (
                "engine alone: docker run --rm IMAGE true",
                statistics.median(s for s, _ in floor),
                statistics.median(c for _, c in floor),
            ),
        ],
    )
    print(
        f"container / subprocess: launch to first op {start['container'] / start['subprocess']:.2f},"
        f" CPU {cpu['container'] / cpu['subprocess']:.2f}"
    )


if __name__ == "__main__":
    main()
