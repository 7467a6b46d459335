"""`jupyter-book` with Sphinx's parallel read: the book's notebooks executed N at a time.

Jupyter Book 1.x passes `jobs` to Sphinx but its command line has no flag for it, so every
notebook of a build runs one after another. This runs jupyter-book's own command line with its
`build_sphinx` given `jobs` (LABSUPPORT_BOOK_JOBS, default: the CPUs this process may use, at
most 4). myst-nb executes a notebook while Sphinx reads its page, and declares itself safe for a
parallel read, so with N jobs N notebooks run at once.

    python -m labsupport.ops.jupyterbook_parallel build <path> [jupyter-book's options]
"""

from __future__ import annotations

import os


def jobs() -> int:
    """How many notebooks to execute at once."""
    raw = os.environ.get("LABSUPPORT_BOOK_JOBS", "").strip()
    if raw:
        return max(1, int(raw))
    return max(1, min(4, len(os.sched_getaffinity(0))))


def _declare_parallel_safe(name: str) -> None:
    """Let Sphinx read in parallel although extension `name` does not say whether it may.
    sphinx-external-toc always loads sphinx-multitoc-numbering, which numbers sections across a
    toc's parts only for a `numbered: true` toc; _toc.yml numbers nothing, so it has nothing to
    merge between processes. Without this Sphinx warns ("assuming it isn't") and reads serially."""
    import importlib

    ext = importlib.import_module(name)
    setup = ext.setup

    def declared(app):
        return {**(setup(app) or {}), "parallel_read_safe": True}

    ext.setup = declared


def _one_page_a_chunk() -> None:
    """Sphinx hands each process a chunk of up to ten pages in name order, which puts most of the
    notebooks into one chunk (the book's pages sort first): one page a chunk keeps every process
    busy until the last notebook."""
    import sphinx.builders

    sphinx.builders.make_chunks = lambda names, nproc, maxbatch=10: [[n] for n in names]


DIED_STARTING = "Kernel died before replying to kernel_info"  # jupyter_client's words


def _start_a_kernel_that_died_starting_once_more() -> None:
    """Give a notebook a second kernel where its first died before it answered. Each kernel's ports
    are picked by binding to a free port and letting it go; with N notebooks starting at once, two
    kernels can pick one port, and the second to bind it dies (ZMQError: Address already in use),
    which fails the notebook and the build. A new kernel manager picks new ports."""
    from jupyter_client.utils import run_sync
    from nbclient import NotebookClient

    start = NotebookClient.async_start_new_kernel_client
    if getattr(start, "once_more", False):
        return

    async def start_once_more(self):
        try:
            return await start(self)
        except RuntimeError as e:
            if DIED_STARTING not in str(e):
                raise
            self.log.warning(f"the notebook's kernel died as it started ({e}); starting another")
        self.km, self.owns_km = self.create_kernel_manager(), True  # the failed start cleared self.km
        await self.async_start_new_kernel()
        return await start(self)

    start_once_more.once_more = True
    NotebookClient.async_start_new_kernel_client = start_once_more
    NotebookClient.start_new_kernel_client = run_sync(start_once_more)


def main() -> None:
    import jupyter_book.sphinx as jb_sphinx
    from jupyter_book.cli.main import main as jupyter_book

    _declare_parallel_safe("sphinx_multitoc_numbering")
    _one_page_a_chunk()
    _start_a_kernel_that_died_starting_once_more()
    build_sphinx = jb_sphinx.build_sphinx

    def parallel(*args, **kwargs):
        kwargs["jobs"] = kwargs.get("jobs") or jobs()
        return build_sphinx(*args, **kwargs)

    jb_sphinx.build_sphinx = parallel  # the command imports it from here when it builds
    jupyter_book()


if __name__ == "__main__":
    main()
