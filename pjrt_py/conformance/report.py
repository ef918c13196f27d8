"""Reporting a conformance run: progress, summary table, JSON, JUnit XML."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from typing import IO, Any

from .runner import STATUSES, Result, path_label


class Progress:
    """A live one-line progress display on a tty; plain lines otherwise.

    On a tty only failing cases get a line of their own; elsewhere (CI
    logs) every case does."""

    def __init__(self, total: int, stream: IO[str], verbose: bool) -> None:
        self.total = total
        self.done = 0
        self.counts: Counter[str] = Counter()
        self.stream = stream
        self.verbose = verbose
        self.live = stream.isatty()

    def __call__(self, result: Result) -> None:
        self.done += 1
        self.counts[result.status] += 1
        line = f"{result.status.upper():<11} {result.target}  {path_label(result.path)}"
        if result.status != "pass":
            line += f": {result.message}"
        if self.live:
            self.stream.write("\r\033[K")
            if result.status != "pass":
                self.stream.write(line + "\n" + details(result, self.verbose))
            counts = " ".join(f"{s} {self.counts[s]}" for s in STATUSES if self.counts[s])
            self.stream.write(f"[{self.done}/{self.total}] {counts}")
        else:
            self.stream.write(line + "\n")
            if result.status != "pass":
                self.stream.write(details(result, self.verbose))
        self.stream.flush()

    def finish(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
            self.stream.flush()


def details(result: Result, verbose: bool) -> str:
    """The indented detail of a non-passing result (``-v`` shows elements)."""
    lines: list[str] = []
    for failure in result.failures:
        where = f" (line {failure['line']})" if failure.get("line") else ""
        lines.append(f"    {failure['check']}{where}: {failure['message']}")
        if verbose:
            for element in failure.get("first", []):
                ulp = "" if element["ulp"] is None else f"  ulp {element['ulp']}"
                lines.append(
                    f"      at {tuple(element['index'])}: got {element['got']}, "
                    f"expected {element['expected']}{ulp}"
                )
            if failure.get("max_ulp") is not None:
                lines.append(f"      max ulp distance {failure['max_ulp']}")
    if result.output and (verbose or result.status in ("crash", "timeout")):
        tail = result.output.splitlines()[-8 if not verbose else -40 :]
        lines += ["    | " + line for line in tail]
    return "".join(line + "\n" for line in lines)


def summary(results: list[Result], labels: list[str], versions: dict[str, str]) -> str:
    """The per-plugin table of counts, plugins side by side as columns."""
    counts = {label: Counter(r.status for r in results if r.target == label) for label in labels}
    heads = [f"{label} (PJRT {versions.get(label, '?')})" for label in labels]
    width = max(12, *(len(h) for h in heads))
    rows = ["".ljust(12) + "".join(h.rjust(width + 2) for h in heads)]
    for status in STATUSES:
        cells = "".join(str(counts[label][status]).rjust(width + 2) for label in labels)
        rows.append(status.ljust(12) + cells)
    return "\n".join(rows) + "\n"


def as_json(results: list[Result], labels: list[str], versions: dict[str, str]) -> str:
    document: dict[str, Any] = {
        "plugins": [
            {
                "label": label,
                "pjrt": versions.get(label),
                "counts": {
                    s: sum(1 for r in results if r.target == label and r.status == s)
                    for s in STATUSES
                },
            }
            for label in labels
        ],
        "results": [
            {
                "plugin": r.target,
                "path": r.path,
                "status": r.status,
                "message": r.message,
                "seconds": round(r.seconds, 6),
                "failures": r.failures,
                "output": r.output,
            }
            for r in results
        ],
    }
    return json.dumps(document, indent=2)


def write_junit(
    results: list[Result], labels: list[str], versions: dict[str, str], out: IO[str]
) -> None:
    """JUnit XML: one <testsuite> per plugin build, one <testcase> per file.

    mismatch -> <failure>, error/crash/timeout -> <error type=status>,
    unsupported -> <skipped>."""
    root = ET.Element("testsuites", name="pjrt-py conformance")
    for label in labels:
        mine = [r for r in results if r.target == label]
        suite = ET.SubElement(
            root,
            "testsuite",
            name=label,
            tests=str(len(mine)),
            failures=str(sum(r.status == "mismatch" for r in mine)),
            errors=str(sum(r.status in ("error", "crash", "timeout") for r in mine)),
            skipped=str(sum(r.status == "unsupported" for r in mine)),
            time=f"{sum(r.seconds for r in mine):.3f}",
        )
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="pjrt_api", value=versions.get(label, "?"))
        for r in mine:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=label,
                name=path_label(r.path),
                time=f"{r.seconds:.3f}",
            )
            text = details(r, verbose=True)
            if r.status == "mismatch":
                ET.SubElement(case, "failure", message=r.message, type="mismatch").text = text
            elif r.status in ("error", "crash", "timeout"):
                ET.SubElement(case, "error", message=r.message, type=r.status).text = text
            elif r.status == "unsupported":
                ET.SubElement(case, "skipped", message=r.message)
    for element in root.iter():  # XML 1.0 cannot hold most control characters
        element.attrib = {k: xml_text(v) for k, v in element.attrib.items()}
        if element.text:
            element.text = xml_text(element.text)
    ET.indent(root)
    out.write(ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n")


# Characters XML 1.0 does not allow, even escaped: C0 controls but tab, newline
# and carriage return, lone surrogates, and U+FFFE / U+FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """``text`` with what XML cannot hold written as ``\\xNN`` / ``\\uNNNN``, readably."""
    return _NOT_XML.sub(lambda m: ascii(m.group())[1:-1], text)
