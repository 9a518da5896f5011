"""A Harbor registry of one's own for tests: a git repository of task folders and a
registry JSON file naming them, as Harbor's ``registry.json`` does (each task: name,
``git_url``, ``git_commit_id``, path). Reached through ``file://`` URLs, so Harbor's
real registry and task clients fetch from it with no network."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

GIT_IDENTITY = ("-c", "user.name=trialbus tests", "-c", "user.email=tests@trialbus.invalid")


@dataclass(frozen=True, slots=True)
class TaskRegistry:
    """The registry file, the repository behind it and the commit it pins."""

    file: Path
    repo: Path
    commit: str

    def commit_change(self, relative: str, text: str) -> str:
        """Write ``text`` to ``relative`` in the repository and commit it (the registry
        still pins the earlier commit); the new commit's id."""
        (self.repo / relative).write_text(text)
        return commit_all(self.repo, f"change {relative}")


def git(repo: Path, *args: str) -> str:
    """``git ARGS`` in ``repo``; its output, stripped."""
    done = subprocess.run(
        ["git", *GIT_IDENTITY, *args], cwd=repo, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    """Commit everything in ``repo``; the commit's id."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def task_registry(
    root: Path, tasks: Mapping[str, Path], *, dataset: str = "mini", version: str = "1.0"
) -> TaskRegistry:
    """A repository under ``root`` holding ``tasks`` (name: source folder, copied to
    ``tasks/<name>``) and a registry file listing them, in that order, as the dataset
    ``dataset@version`` pinned at the repository's commit."""
    repo = root / "repo"
    for name, source in tasks.items():
        shutil.copytree(source, repo / "tasks" / name)
    git(repo, "init", "-q")
    commit = commit_all(repo, "tasks")
    entries = [
        {
            "name": name,
            "git_url": repo.as_uri(),
            "git_commit_id": commit,
            "path": f"tasks/{name}",
        }
        for name in tasks
    ]
    file = root / "registry.json"
    spec = {"name": dataset, "version": version, "description": "test tasks", "tasks": entries}
    file.write_text(json.dumps([spec], indent=2))
    return TaskRegistry(file, repo, commit)


@contextmanager
def served_file(path: Path) -> Iterator[tuple[str, list[str]]]:
    """Serve ``path`` over HTTP on a free loopback port: (its URL, the paths asked for,
    growing as requests come)."""
    requests: list[str] = []
    body = path.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # the list is the log

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/{path.name}", requests
    finally:
        server.shutdown()
        server.server_close()
