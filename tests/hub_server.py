"""A small stand-in for the Hugging Face Hub on 127.0.0.1, for tests (a real HTTP server, never a mock).

It serves what huggingface_hub 2.x calls for `create_repo`, `upload_folder` / `create_commit` (preupload, then
one NDJSON commit with every file inline: the server answers "regular" for every file, so no LFS), the card
check upload_folder makes (/api/validate-yaml: front matter parses, base_model is a Hub id), and the
file download that `ModelCard.load` / `metadata_update` / `from_pretrained` do (HEAD + GET of
resolve/<revision>/<path>), and a folder's listing (api/models/<repo>/tree/<revision>/<folder>).
Every commit is recorded, in order:

    with HubServer() as hub:                     # tests/ is on sys.path under pytest
        env = {"HF_ENDPOINT": hub.url, ...}      # and the HF_HUB_OFFLINE-style variables unset
        ...
        hub.commits            # [{"repo", "message", "files": {path: bytes}}]
        hub.files("me/model")  # the repo's files after the last commit
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml


class HubServer:
    def __init__(self):
        self.repos: dict[str, dict] = {}  # repo -> {"files": {path: bytes}, "sha": str}
        self.commits: list[dict] = []
        self.requests: list[tuple[str, str]] = []
        self.validated: list[str] = []  # README.md texts sent to /api/validate-yaml
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def files(self, repo: str) -> dict:
        return dict(self.repos[repo]["files"])

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, obj, status: int = 200):
                self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json"})

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_POST(self):
                path = self.path.split("?")[0]
                hub.requests.append(("POST", path))
                body = self._body()
                if path == "/api/repos/create":
                    payload = json.loads(body)
                    repo = f"{payload['organization']}/{payload['name']}" if payload.get("organization") \
                        else payload["name"]
                    with hub._lock:
                        hub.repos.setdefault(repo, {"files": {}, "sha": "0" * 40})
                    return self._json({"url": f"{hub.url}/{repo}", "name": repo, "id": repo})
                if path == "/api/validate-yaml":
                    return self._validate(json.loads(body)["content"])
                match = re.fullmatch(r"/api/models/(.+)/(preupload|commit)/([^/]+)", path)
                if not match or match.group(1) not in hub.repos:
                    return self._json({"error": f"Repository not found: {path}"}, 404)
                repo, action = match.group(1), match.group(2)
                if action == "preupload":
                    files = json.loads(body)["files"]
                    return self._json({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                 for f in files]})
                lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                header = next(line["value"] for line in lines if line["key"] == "header")
                files = {}
                for line in lines:
                    if line["key"] == "file":
                        files[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
                    elif line["key"] in ("lfsFile", "deletedFile", "deletedFolder"):
                        return self._json({"error": f"{line['key']} not supported by the stand-in"}, 400)
                with hub._lock:
                    state = hub.repos[repo]
                    state["files"].update(files)
                    state["sha"] = hashlib.sha1(json.dumps(sorted((k, hashlib.sha1(v).hexdigest())
                                                                  for k, v in state["files"].items())).encode()
                                                ).hexdigest()
                    hub.commits.append({"repo": repo, "message": header["summary"], "files": files})
                return self._json({"commitUrl": f"{hub.url}/{repo}/commit/{state['sha']}", "commitOid": state["sha"],
                                   "pullRequestUrl": None})

            def _validate(self, content: str):
                """Some of the Hub's card checks: front matter that parses, base_model a Hub id, not a path."""
                hub.validated.append(content)
                errors = []
                try:
                    meta = yaml.safe_load(content.split("---")[1]) if content.startswith("---") else {}
                except yaml.YAMLError as err:
                    meta, errors = {}, [f"YAML: {err}"]
                for base in [meta.get("base_model")] if isinstance(meta.get("base_model"), str) else \
                        meta.get("base_model") or []:
                    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", str(base)):
                        errors.append(f'"base_model" must be a Hub model id, got {base!r}')
                if errors:
                    return self._json({"errors": [{"message": e} for e in errors]}, 400)
                return self._json({"warnings": []})

            def _resolve(self, head: bool):
                hub.requests.append(("HEAD" if head else "GET", self.path))
                match = re.fullmatch(r"/(.+?/[^/]+)/resolve/([^/]+)/(.+)", self.path.split("?")[0])
                state = hub.repos.get(match.group(1)) if match else None
                content = state["files"].get(match.group(3)) if state else None
                if content is None:
                    return self._send(404, b"", {"X-Error-Code": "EntryNotFound" if state else "RepoNotFound"},
                                      head=head)
                etag = hashlib.sha1(content).hexdigest()
                self._send(200, content, {"ETag": f'"{etag}"', "X-Repo-Commit": state["sha"]}, head=head)

            def do_HEAD(self):
                self._resolve(head=True)

            def do_GET(self):
                if self.path.startswith("/api/models/"):
                    return self._tree()
                self._resolve(head=False)

            def _tree(self):
                """A folder's listing (list_repo_tree, which AutoProcessor calls for additional_chat_templates/):
                the files under it, or the Hub's 404 EntryNotFound for a folder the repo lacks."""
                hub.requests.append(("GET", self.path))
                match = re.fullmatch(r"/api/models/(.+?/[^/]+)/tree/([^/]+)/?(.*)", self.path.split("?")[0])
                state = hub.repos.get(match.group(1)) if match else None
                if state is None:
                    return self._send(404, b"", {"X-Error-Code": "RepoNotFound"})
                folder = match.group(3).strip("/")
                entries = [{"type": "file", "path": path, "size": len(content), "oid": hashlib.sha1(content).hexdigest()}
                           for path, content in sorted(state["files"].items())
                           if not folder or path.startswith(folder + "/")]
                if not entries:
                    return self._send(404, b"", {"X-Error-Code": "EntryNotFound"})
                self._json(entries)

        return Handler

    def __enter__(self) -> HubServer:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
