"""Headless Chromium (Debian's `chromium`) driven over the DevTools protocol with `websockets`: open a page, wait
for text, click a button by its label, read what a person sees, and save a screenshot. No browser download, no
driver: the protocol is Chromium's own."""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
RELATIVE_AGE = re.compile(r"\b(?:\d+|an?|a few) (?:second|minute|hour|day)s? ago\b")


class Page:
    """One tab: calls of the DevTools protocol, in order, each waiting for its answer."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self.call("Page.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        self._ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            answer = json.loads(self._ws.recv(timeout=60))
            if answer.get("id") == message_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result.get("result", {}).get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def wait_for_text(self, *needles: str, timeout_s: float = 60) -> str:
        """The page's text once it holds every needle."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.text()
            if all(n in text for n in needles):
                return text
            if time.monotonic() > deadline:
                missing = [n for n in needles if n not in text]
                raise AssertionError(f"the page never showed {missing}; it shows: {text[:1500]!r}")
            time.sleep(0.5)

    def wait_for(self, condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        """Until `condition()` holds, looking again every half second."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"the page never showed {what}; it shows: {self.text()[:1500]!r}")
            time.sleep(0.5)

    def settle(self, timeout_s: float = 30) -> str:
        """The page's text once nothing is loading and it stayed the same for a second (for a screenshot). Ages
        ("Loaded 12 seconds ago", "a minute ago") count as the same: Dagster's pages count them up every second, so
        a page compared with them never settles."""
        deadline = time.monotonic() + timeout_s
        previous, since = None, time.monotonic()
        while time.monotonic() < deadline:
            text = self.text()
            shown = RELATIVE_AGE.sub("… ago", text)
            if shown != previous or "Loading" in text:
                previous, since = shown, time.monotonic()
            elif time.monotonic() - since >= 1:
                return text
            time.sleep(0.5)
        return self.text()

    def button(self, label: str) -> dict[str, Any] | None:
        """The first button whose text is `label`: whether it is enabled."""
        return self.evaluate(
            "(() => { const b = [...document.querySelectorAll('button')].find(b => b.innerText.trim() === "
            + json.dumps(label)
            + "); return b ? {disabled: b.disabled || b.getAttribute('aria-disabled') === 'true'} : null; })()"
        )

    def click(self, label: str) -> None:
        clicked = self.evaluate(
            "(() => { const b = [...document.querySelectorAll('button')].find(b => b.innerText.trim() === "
            + json.dumps(label)
            + "); if (!b) return false; b.click(); return true; })()"
        )
        assert clicked, f"no button {label!r}"

    def screenshot(self, path: Path) -> None:
        shot = self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))


@contextmanager
def chromium(profile: Path, width: int = 1280, height: int = 800) -> Iterator[Page]:
    """A headless Chromium with one page, ended (its process group) at the end."""
    process = subprocess.Popen(
        [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None:
            line = process.stderr.readline() if process.stderr else ""
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if found:
                port = int(found.group(1))
            assert process.poll() is None and time.monotonic() < deadline, f"chromium did not start: {line}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            targets = json.load(answer)
        [target] = [t for t in targets if t.get("type") == "page"][:1]
        with connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:  # closed on leaving
            page = Page(ws)
            page.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
            yield page
    finally:
        os.killpg(process.pid, 9)
        process.wait(timeout=30)
