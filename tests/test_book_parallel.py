"""The book's build executes several notebooks at once (labsupport.ops.jupyterbook_parallel):
jupyter-book's own command with Sphinx's parallel read, one page a process."""

import pytest

from labsupport.ops import bookbuild, jupyterbook_parallel

pytestmark = pytest.mark.unit


def test_jobs_follow_the_variable_and_the_cpus(monkeypatch):
    monkeypatch.setenv("LABSUPPORT_BOOK_JOBS", "3")
    assert jupyterbook_parallel.jobs() == 3
    monkeypatch.setenv("LABSUPPORT_BOOK_JOBS", "0")
    assert jupyterbook_parallel.jobs() == 1
    monkeypatch.delenv("LABSUPPORT_BOOK_JOBS")
    assert 1 <= jupyterbook_parallel.jobs() <= 4


def test_every_page_is_a_chunk_of_its_own(monkeypatch):
    import sphinx.builders

    monkeypatch.setattr(sphinx.builders, "make_chunks", sphinx.builders.make_chunks)
    names = [f"notebooks/n{i}" for i in range(23)]
    assert len(sphinx.builders.make_chunks(names, 2)) < len(names)  # Sphinx's own: ten pages a chunk
    jupyterbook_parallel._one_page_a_chunk()
    assert sphinx.builders.make_chunks(names, 2) == [[n] for n in names]


def test_multitoc_numbering_is_declared_safe_for_a_parallel_read(monkeypatch):
    import sphinx_multitoc_numbering as ext

    monkeypatch.setattr(ext, "setup", ext.setup)

    class App:
        def __getattr__(self, name):  # the extension only registers things
            return lambda *a, **k: None

    assert "parallel_read_safe" not in (ext.setup(App()) or {})
    jupyterbook_parallel._declare_parallel_safe("sphinx_multitoc_numbering")
    assert ext.setup(App())["parallel_read_safe"] is True


def test_the_build_runs_jupyter_book_through_the_parallel_command(monkeypatch, tmp_path):
    seen = []

    class Done:
        def __init__(self, cmd, *a, **k):
            seen.append(cmd)
            self.stdout = iter(["build succeeded.\n"])

        def wait(self):
            return 0

    monkeypatch.setattr(bookbuild.subprocess, "Popen", Done)
    monkeypatch.setattr(bookbuild, "check_runs", lambda root: None)
    bookbuild.build(out=tmp_path / "out", log=tmp_path / "book.log", echo=False)
    (cmd,) = seen
    assert cmd[1:4] == ["-m", "labsupport.ops.jupyterbook_parallel", "build"] and "--warningiserror" in cmd


def test_a_notebook_whose_kernel_died_starting_on_a_taken_port_gets_another(monkeypatch):
    """The build's kernels pick their ports at once; one that binds a port another took dies before it answers
    (jupyter_client: "Kernel died before replying to kernel_info"). Here a notebook's first kernel is given a port
    that is taken: without the retry the notebook fails as in the build; with it, it runs on a second kernel, which
    is shut down after it as the first would have been."""
    import atexit
    import socket

    import nbformat
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    made = []

    class FirstOnTheTakenPort(AsyncKernelManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            made.append(self)
            if len(made) == 1:  # cache_ports off, else jupyter_client picks the ports itself
                self.cache_ports, self.shell_port = False, taken.getsockname()[1]

    def client():
        cell = nbformat.v4.new_code_cell("print(6 * 7)")
        nb = nbformat.v4.new_notebook(cells=[cell])
        return NotebookClient(nb, kernel_manager_class=FirstOnTheTakenPort, startup_timeout=60)

    try:
        failed = client()
        with pytest.raises(RuntimeError, match=jupyterbook_parallel.DIED_STARTING):
            failed.execute()
        atexit.unregister(failed._cleanup_kernel)  # nothing is left to clean: the failed start cleared it
        assert len(made) == 1
        made.clear()
        for name in ("async_start_new_kernel_client", "start_new_kernel_client"):  # patched for this test only
            monkeypatch.setattr(NotebookClient, name, getattr(NotebookClient, name))
        jupyterbook_parallel._start_a_kernel_that_died_starting_once_more()
        second = client()
        ran = second.execute()
    finally:
        taken.close()
    assert ran.cells[0].outputs[0]["text"] == "42\n"
    assert len(made) == 2 and second.km is None  # a second kernel ran it, and was shut down
