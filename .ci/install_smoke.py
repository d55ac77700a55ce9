"""Smoke check of one documented install (run by .ci/install_matrix.sh).

``python .ci/install_smoke.py JOB VENV SRC``: VENV is a fresh virtualenv holding nothing but
``pip install -e 'SRC[extras of JOB]'``; its ``flowtrial`` runs the commands that install is
for. This driver runs in CI's own environment (the test extras), so the official openai SDK
and the PostgreSQL server helper of the tests talk to the fresh install from outside it.
Exit 0 when the job's commands did what the docs promise; otherwise the reason, and exit 1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.pg_server, tests.instrumentation.otlp_payloads


class SmokeFailure(Exception):
    pass


class Job:
    def __init__(self, venv: Path, src: Path, work: Path) -> None:
        self.bin, self.src, self.work = venv / "bin", src, work
        # The fresh install only: nothing of CI's environment leaks in.
        self.env = {"PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8",
                    "COLUMNS": "120"}

    def run(self, *args: str, timeout: float = 600, env: dict[str, str] | None = None,
            program: str = "flowtrial") -> str:
        proc = subprocess.run([str(self.bin / program), *args], cwd=self.work,
                              env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            raise SmokeFailure(f"`{program} {' '.join(args)}` exited {proc.returncode}:\n"
                               f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        return proc.stdout + proc.stderr

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(self.bin / "flowtrial"), *args], cwd=self.work,
                                env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def study(self, name: str = "study.toml") -> Path:
        """The init template, with short waits (its default draws TTFTs up to 30 s)."""
        self.run("init", name)
        path = self.work / name
        text = path.read_text()
        default = 'ttft_ms = { min = 200, max = 30000, scale = "log" }'
        if default not in text:
            raise SmokeFailure(f"the init template no longer has {default!r} under [per_prompt]")
        path.write_text(text.replace(default, 'ttft_ms = { min = 20, max = 40, scale = "log" }'))
        self.run("validate", "--study", name)
        return path

    def simulated(self, db: str = "sim.db") -> str:
        self.study("sim.toml")
        self.run("simulate", "--study", "sim.toml", "--db", db, "--participants", "8",
                 "--tasks", "3", "--prompts-per-task", "6", "--seed", "3")
        return db


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[str], timeout: float = 120) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SmokeFailure(f"exited {proc.returncode} before serving {url}:\n"
                               f"{proc.stdout.read() if proc.stdout else ''}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return bytes(r.read())
        except OSError:
            if time.monotonic() > deadline:
                raise SmokeFailure(f"nothing served {url} within {timeout:.0f} s") from None
            time.sleep(0.5)


def stop(proc: subprocess.Popen[str], port: int) -> str:
    """SIGTERM; the command (and any child server) must be gone and the port free."""
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise SmokeFailure("did not stop within 60 s of SIGTERM") from None
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise SmokeFailure(f"port {port} still answers after SIGTERM")
    return out or ""


def demo(job: Job) -> None:
    """README: pip install -e '.[demo]' && flowtrial demo (shortened: 4 participants)."""
    job.run("--help")
    out = job.run("demo", "--dir", "demo", "--participants", "4", timeout=900)
    if not (job.work / "demo" / "report" / "report.html").is_file():
        raise SmokeFailure(f"the demo wrote no report:\n{out[-3000:]}")


def study(job: Job) -> None:
    """README's study install '.[proxy,analysis]': the five commands, the proxy answering the
    official openai SDK, the analysis writing its report."""
    import openai

    job.study()
    out = job.run("enroll", "--study", "study.toml", "--db", "study.db", "--participant",
                  "p01")
    key = re.search(r"^(ft_\S+)$", out, re.M)
    if key is None:
        raise SmokeFailure(f"enroll printed no key:\n{out}")
    job.run("status", "--db", "study.db")
    port = free_port()
    proc = job.start("proxy", "--study", "study.toml", "--db", "study.db", "--port", str(port))
    try:
        wait_http(f"http://127.0.0.1:{port}/flowtrial/v1/health", proc)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key.group(1),
                               max_retries=0, timeout=60)
        reply = client.chat.completions.create(
            model="flowtrial-mock", messages=[{"role": "user", "content": "Say hello"}])
        if not reply.choices[0].message.content:
            raise SmokeFailure("the proxy's answer was empty")
    finally:
        out = stop(proc, port)
    if "1 cycles recorded" not in out or "agent telemetry (OTLP) off" not in out:
        raise SmokeFailure(f"unexpected proxy output:\n{out}")
    db = job.simulated()
    job.run("analyze", "--db", db, "--out", "report", "--n-boot", "20", timeout=900)
    if not (job.work / "report" / "report.html").is_file():
        raise SmokeFailure("analyze wrote no report.html")


def dashboard(job: Job) -> None:
    """'.[dashboard]': the dashboard serves its first page, and stops on SIGTERM."""
    db = job.simulated()
    port = free_port()
    proc = job.start("dashboard", "--db", db, "--port", str(port))
    try:
        if wait_http(f"http://127.0.0.1:{port}/_stcore/health", proc).strip() != b"ok":
            raise SmokeFailure("Streamlit's health check did not say ok")
        page = wait_http(f"http://127.0.0.1:{port}/", proc)
        if b"<html" not in page.lower():
            raise SmokeFailure("the first page is not HTML")
    finally:
        stop(proc, port)


def notebooks(job: Job) -> None:
    """'.[notebooks]': one analysis notebook runs top to bottom on a study database."""
    db = job.simulated()
    notebook = job.src / "analysis" / "notebooks" / "task_effects.ipynb"
    job.run("nbconvert", "--to", "notebook", "--execute", "--output-dir", str(job.work),
            "--ExecutePreprocessor.timeout=600", str(notebook), program="jupyter",
            env={"FLOWTRIAL_DB": str(job.work / db)}, timeout=900)
    executed = json.loads((job.work / "task_effects.ipynb").read_text())
    errors = [o for c in executed["cells"] for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    if errors:
        raise SmokeFailure(f"the notebook raised: {errors[0].get('evalue')}")


def postgres(job: Job) -> None:
    """'.[postgres]': a study on a real PostgreSQL server (a throwaway cluster)."""
    from tests.pg_server import start_server

    server = start_server()
    try:
        url = server.new_database().replace("postgresql+psycopg://", "postgresql://")
        job.study()
        job.run("enroll", "--study", "study.toml", "--db", url, "--participant", "p01")
        out = job.run("status", "--db", url, "--json")
        if "p01" not in out and '"participants": 1' not in out.replace(" ", " "):
            json.loads(out)  # at least a JSON answer
    finally:
        server.remove()


def telemetry(job: Job) -> None:
    """'.[telemetry]': an agent's OTLP JSON imported as events."""
    from google.protobuf import json_format

    from tests.instrumentation.otlp_payloads import gemini_log, logs_request

    job.study()
    job.run("enroll", "--study", "study.toml", "--db", "study.db", "--participant", "p01")
    t0 = int(time.time()) * 1_000_000_000
    request = logs_request([gemini_log("user_prompt", t0, {"prompt_length": 5,
                                                           "prompt_id": "p#1"})], "gemini-cli")
    (job.work / "otel.json").write_text(json.dumps(json_format.MessageToDict(request)) + "\n")
    out = job.run("import-otel", "--db", "study.db", "--participant", "p01", "otel.json")
    if "turn_start" not in out:
        raise SmokeFailure(f"nothing imported:\n{out}")


JOBS: dict[str, Callable[[Job], None]] = {
    "demo": demo, "study": study, "dashboard": dashboard, "notebooks": notebooks,
    "postgres": postgres, "telemetry": telemetry}


def main() -> int:
    name, venv, src = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    with tempfile.TemporaryDirectory(prefix=f"flowtrial-smoke-{name}-") as work:
        os.chmod(work, 0o755)
        try:
            JOBS[name](Job(venv, src, Path(work)))
        except (SmokeFailure, subprocess.TimeoutExpired) as exc:
            print(f"install smoke {name}: FAILED: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
