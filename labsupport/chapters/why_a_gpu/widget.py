"""The live notebook's explorer of the sweep (not shown in the web book)."""

from __future__ import annotations

from labsupport import runs

from .batch_sweep import bound_at, sweep


def explorer(run: runs.Run):
    """An ipywidgets explorer of the sweep: pick a batch size, read time, tokens/s, bound."""
    import ipywidgets as widgets

    s = sweep(run).set_index("batch")

    def show(batch):
        r = s.loc[batch]
        return (
            f"<b>batch {batch}</b>: GPU time {r['GPU ms']:.2f} ms per step, wall {r['wall ms']:.2f} ms (minimum); "
            f"{r['tokens/s']:,.0f} tokens/s (GPU alone could do {r['GPU tokens/s']:,.0f}); "
            f"weights+KV read at {r['TB/s']:.2f} TB/s; matmuls at {r['matmul TFLOP/s']:.0f} TFLOP/s; "
            f"{bound_at(run, batch)}"
        )

    first = s.index.min()
    slider = widgets.SelectionSlider(options=list(s.index), value=first, description="batch")
    out = widgets.HTML(show(first))
    slider.observe(lambda change: setattr(out, "value", show(change["new"])), names="value")
    return widgets.VBox([slider, out])
