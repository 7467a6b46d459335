"""The chapter's own figure: the queue between the CPU and the GPU."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from labsupport.figures import OURS, WIDTH, finish


def queue(q: pd.DataFrame, label: str):
    """Per launch: when the CPU's launch call returned, and when the GPU finished that kernel."""
    fig, ax = plt.subplots(figsize=(WIDTH, 3.6))
    ax.plot(q.launch, q.call_return_us / 1e3, color="#444", label="CPU: launch call returned")
    ax.plot(q.launch, q.gpu_done_us / 1e3, color=OURS, label="GPU: kernel finished")
    ax.fill_between(
        q.launch, q.call_return_us / 1e3, q.gpu_done_us / 1e3, color=OURS, alpha=0.12, label="waiting in the queue"
    )
    ax.set_xlabel("launch number")
    ax.set_ylabel("ms since the first launch")
    ax.set_title("The CPU runs ahead; the GPU works through the queue")
    ax.legend(fontsize=10, frameon=False)
    lead = (q.gpu_done_us - q.call_return_us).max() / 1e3
    takeaway = (
        f"{len(q)} launches; at most {lead:.2f} ms of work waits in the queue, the CPU that far ahead of the GPU."
    )
    return finish(fig, label, takeaway)
