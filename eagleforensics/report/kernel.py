"""The kernel a report runs its notebook in, and the work folder it leaves nothing outside of.

``kernel_manager_class(workdir)`` gives papermill a kernel manager whose ``python3`` kernel is
this interpreter's ipykernel, run isolated (``process.isolated_python``), talking over Unix sockets, whose connection file (it holds the
session key) is written inside the work folder instead of the temp dir's root, and whose
process stdout/stderr go to ``kernel.log`` there, or nowhere without a work folder (the
kernel's own noise on an interrupt, "Parent appears to have exited", never reaches the
user's terminal; what cells print comes over the kernel's sockets as before). ``work_folder`` is the temporary
folder of one report run: on every way out (success, error, Ctrl-C, SIGTERM) any kernel still
running is killed and the folder, with the half-run notebook, the connection file and the
sockets, is removed, with signals held so a second Ctrl-C cannot cut that short.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any, Iterator

from ..errors import ForensicsError, printable
from ..interrupts import signals_held
from ..process import isolated_python

INSTALL_HINT = "pip install 'eagleforensics[report]'"
CONNECTION_FILE = "kernel.json"
KERNEL_LOG = "kernel.log"
LAUNCH_KERNEL = "from ipykernel.kernelapp import launch_new_instance; launch_new_instance()"


class WorkFolder:
    """One report run's temporary folder and the kernels started for it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.kernels: list[Any] = []  # the kernel managers started here (their processes are killed on the way out)

    def kernel_log_tail(self) -> str:
        """The kernel's last line of output (why it died), printable; empty if none."""
        try:
            lines = (self.path / KERNEL_LOG).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return printable(lines[-1])[:200] if lines else ""


@contextlib.contextmanager
def work_folder(prefix: str = "eagleforensics-report-") -> Iterator[WorkFolder]:
    """A fresh private temporary folder; on any exit, kernels started in it are killed and the folder removed."""
    folder = WorkFolder(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        yield folder
    finally:
        with signals_held():
            stop_kernels(folder.kernels)
            shutil.rmtree(folder.path, ignore_errors=True)


def stop_kernels(managers: list[Any]) -> None:
    """Kill every kernel process of ``managers`` still alive (its own session: the whole group) and wait for it.

    papermill shuts a kernel down politely when the run ends or fails; this is for the ways out
    it does not see (an interrupt while the kernel starts, during cleanup). No asyncio: it must
    work while the event loop is stopped.
    """
    for km in managers:
        proc = getattr(getattr(km, "provisioner", None), "process", None)
        if proc is None or proc.poll() is not None:
            continue
        try:
            os.killpg(proc.pid, signal.SIGKILL) if hasattr(os, "killpg") else proc.kill()
        except OSError:
            with contextlib.suppress(OSError):
                proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)


def kernel_manager_class(workdir: WorkFolder | Path | None = None) -> type:
    """A kernel manager whose ``python3`` kernel is this interpreter's ipykernel, not a python3 found elsewhere.

    Its sockets are Unix domain sockets where the OS has them, so the kernel opens no TCP port,
    and its shutdown sends no SIGINT (which made ipykernel log a KeyboardInterrupt error). With
    ``workdir`` its connection file and its log are written there, and (for a ``WorkFolder``)
    every manager that starts a kernel is recorded so ``work_folder`` can stop it.
    """
    try:
        from ipykernel.kernelspec import RESOURCES, get_kernel_dict
        from jupyter_client import AsyncKernelManager
        from jupyter_client.kernelspec import (
            NATIVE_KERNEL_NAME,
            KernelSpec,
            KernelSpecManager,
        )
        from traitlets import default
    except ImportError as exc:
        raise ForensicsError(f"the report needs ipykernel and jupyter_client ({exc}); {INSTALL_HINT}") from None

    folder = workdir if isinstance(workdir, WorkFolder) else None
    where = folder.path if folder is not None else (Path(workdir) if workdir is not None else None)

    class HereSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            if kernel_name == NATIVE_KERNEL_NAME:
                spec = get_kernel_dict()
                # isolated (no current folder, PYTHONPATH or user site on sys.path; IPython adds no current
                # folder under -I either), importing this very eagleforensics: ipykernel_launcher's work, by hand
                spec["argv"] = [*isolated_python(LAUNCH_KERNEL), "-f", "{connection_file}"]
                return KernelSpec(resource_dir=RESOURCES, **spec)
            return super().get_kernel_spec(kernel_name)

    class HereKernelManager(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _here_specs(self) -> KernelSpecManager:
            return HereSpecs(data_dir=self.data_dir)

        @default("transport")
        def _local_sockets(self) -> str:
            return "ipc" if os.name == "posix" else "tcp"  # Unix sockets: no TCP port, no plain-text warning

        @default("connection_file")
        def _connection_file_here(self) -> str:
            # jupyter_client's default is a mkstemp file in the temp dir's root, which a killed run leaves behind
            return str(where / CONNECTION_FILE) if where is not None else ""

        @default("ip")
        def _ip_here(self) -> str:
            # ipc socket names stay relative (the kernel runs in the work folder): a long TMPDIR cannot
            # push a socket path past the 108 bytes a Unix socket name may have
            if self.transport == "ipc":
                return "kernel-ipc"
            return super()._ip_default()

        async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
            if folder is not None:
                folder.kernels.append(self)
            # the kernel process's own output (not the cells': those come over its sockets) never reaches
            # the user's terminal: into kernel.log in the work folder, else nowhere
            with (open(where / KERNEL_LOG, "ab") if where is not None else open(os.devnull, "wb")) as log:
                kw.setdefault("stdout", log)  # the child keeps its own copy of the descriptor
                kw.setdefault("stderr", log)
                return await super()._async_launch_kernel(kernel_cmd, **kw)

        async def _async_interrupt_kernel(self) -> None:
            # jupyter_client sends SIGINT before every shutdown request; when it lands while the kernel
            # handles a message, ipykernel logs "[IPKernelApp] ERROR | KeyboardInterrupt caught in
            # kernel." on stderr. papermill shuts down only after the last cell, so skip it then; the
            # shutdown request (then SIGTERM, SIGKILL) still ends the kernel.
            if self.shutting_down:
                return
            await super()._async_interrupt_kernel()

    return HereKernelManager
