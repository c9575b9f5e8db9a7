"""Headless Chromium (Debian's `chromium` package) driven over the DevTools protocol, for tests/test_docs.py and the
README's screenshots of the documentation site.

    uv run mkdocs build --strict
    uv run python tests/chromium.py site docs/img/home.png:index.html \
        docs/img/script.png:scripts/crossq_continuous_action/index.html#results

serves the built site over HTTP on a free local port and writes a 1280x800 screenshot of each page.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from websockets.sync.client import connect

# What a test reads from a rendered page. Images count as loaded when the browser decoded them (naturalWidth > 0);
# the promise waits for those still loading.
PAGE_FACTS = """
(async () => {
    const images = [...document.querySelectorAll("article img")];
    await Promise.all(images.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })));
    return {
        title: document.title,
        h1: document.querySelector("article h1")?.textContent ?? "",
        tables: document.querySelectorAll("article table").length,
        images: images.map(i => ({src: i.getAttribute("src"), loaded: i.complete && i.naturalWidth > 0})),
        navLinks: document.querySelectorAll("nav.md-nav a").length,
    };
})()
"""


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Site:
    """A built site served on 127.0.0.1 (a thread; Material's pages load their assets by relative URL)."""

    def __init__(self, root: Path):
        handler = functools.partial(QuietHandler, directory=str(root))
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class Browser:
    """One headless Chromium with one tab; `page(url)` loads a page and returns PAGE_FACTS of it."""

    def __init__(self, width: int = 1280, height: int = 800):
        self.resources = contextlib.ExitStack()
        # Chromium's helper processes can still be writing the profile while it is removed (CI at 700bd08: "Directory
        # not empty: 'Default'" at close): the whole process group is stopped first, and what is left is not an error.
        self.profile = self.resources.enter_context(tempfile.TemporaryDirectory(ignore_cleanup_errors=True))
        flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"]
        self.process = subprocess.Popen(
            [chromium_path(), *flags, "--remote-debugging-port=0", f"--user-data-dir={self.profile}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: close() stops the helpers with it
        )
        port = None
        for line in self.process.stderr:  # "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
            if match := re.search(r"ws://127\.0\.0\.1:(\d+)/", line):
                port = match[1]
                break
        if port is None:
            raise RuntimeError(f"chromium exited with {self.process.wait()} before listening")
        threading.Thread(target=self.process.stderr.read, daemon=True).start()  # keep its pipe drained
        request = urllib.request.Request(f"http://127.0.0.1:{port}/json/new?about:blank", method="PUT")
        with urllib.request.urlopen(request, timeout=30) as response:
            tab = json.load(response)
        self.socket = self.resources.enter_context(
            connect(tab["webSocketDebuggerUrl"], max_size=64 * 2**20, open_timeout=30)
        )
        self.ids = itertools.count(1)
        self.events: list[dict] = []
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, timeout: float = 60, **params) -> dict:
        """Send one DevTools command, wait for its reply (events that arrive meanwhile are kept in self.events)."""
        message_id = next(self.ids)
        self.socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=timeout))
            if message.get("id") == message_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def wait_for(self, event: str, timeout: float = 60) -> None:
        while not any(e.get("method") == event for e in self.events):
            self.events.append(json.loads(self.socket.recv(timeout=timeout)))
        self.events.clear()

    def page(self, url: str) -> dict:
        for address in ("about:blank", url):  # via a blank page: a URL that differs only by its #anchor loads nothing
            self.events.clear()
            self.call("Page.navigate", url=address)
            self.wait_for("Page.loadEventFired")
        result = self.call("Runtime.evaluate", expression=PAGE_FACTS, awaitPromise=True, returnByValue=True)
        return result["result"]["value"]

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # helpers that outlived it
        self.resources.close()


def main(argv: list[str]) -> None:
    if len(argv) < 2 or chromium_path() is None:
        sys.exit("usage: python tests/chromium.py SITE_DIR OUT.png:PAGE ... (needs Debian's chromium package)")
    site, browser = Site(Path(argv[0])), Browser()
    try:
        for spec in argv[1:]:
            out, _, page = spec.partition(":")
            facts = browser.page(site.url + page)
            browser.screenshot(Path(out))
            print(f"{out}: {facts['title']!r}, {facts['tables']} tables, {len(facts['images'])} images")
    finally:
        browser.close()
        site.close()


if __name__ == "__main__":
    main(sys.argv[1:])
