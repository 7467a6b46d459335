"""The GPUs' link, from `nvidia-smi topo -m`: the entry between two GPUs and what it means, read
when a run is recorded and again from the run's own topology.txt when it is read."""

from __future__ import annotations

import re


def link_between(topo: str, a: int = 0, b: int = 1) -> str | None:
    """The entry of `nvidia-smi topo -m`'s matrix between GPU a and GPU b ("NV18", "PIX", ...)."""
    topo = re.sub(r"\x1b\[[0-9;]*m", "", topo)  # nvidia-smi underlines its header with terminal escapes
    lines = [ln for ln in topo.splitlines() if ln.strip()]
    # The header starts with blank space (its first column names the rows), each row with its GPU.
    header = next((ln.split() for ln in lines if ln[0].isspace() and "GPU0" in ln.split()), None)
    row = next((ln.split() for ln in lines if ln.split()[0] == f"GPU{a}" and not ln[0].isspace()), None)
    if header is None or row is None or f"GPU{b}" not in header:
        return None
    col = header.index(f"GPU{b}") + 1  # the row starts with its own name
    return row[col] if col < len(row) else None


def interconnect(link: str | None) -> str:
    """What a topology entry means: NVLink (NV<n>), PCIe (PIX, PXB, PHB, NODE, SYS), or unknown."""
    if link is None:
        return "unknown"
    if re.fullmatch(r"NV\d+", link):
        return f"NVLink ({link[2:]} links)"
    return {
        "PIX": "PCIe, one switch",
        "PXB": "PCIe, several switches",
        "PHB": "PCIe through the CPU's host bridge",
    }.get(link, "PCIe across CPU sockets" if link in ("NODE", "SYS") else link)


def recorded_interconnect(run) -> dict:
    """{"gpu0_gpu1": entry, "means": ...} from a recorded run's own topology.txt (read again, so
    a better parser serves older runs too), else what the run's results say, else unknown."""
    if (run.path / "topology.txt").is_file():
        link = link_between(run.file("topology.txt").read_text())
        return {"gpu0_gpu1": link, "means": interconnect(link)}
    return run.results.get("interconnect") or {"gpu0_gpu1": None, "means": "unknown"}
