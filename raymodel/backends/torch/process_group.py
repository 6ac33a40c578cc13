"""``ProcessGroup``: Ray's ``TorchConfig`` for raymodel's torch runs, without importing torch on the run's
controller.

Ray Train unpickles a run's backend config on the run's controller, and ``TorchConfig`` lives in a
module that imports torch at its top (``ray.train.torch.config``). So the controller of every torch,
Lightning and transformers run, and of every pool, imported torch only to tell the workers to set up
their process group: about 2.2 s of a core, a third of its construction, and the workers are asked
for after it (``benchmarks/first_job_timeline.py``: the controller's construction).

``ProcessGroup`` is the same configuration (``backend``, ``init_method``, ``timeout_s``) with the same
controller side as Ray's ``_TorchBackend`` (Ray 2.60) on CPUs and GPUs: rank 0's address, then on each
worker Ray's own steps, imported there, where torch is loaded anyway:
``_set_torch_distributed_env_vars`` (``RANK``, ``LOCAL_RANK``, ..., which Accelerate and Lightning
read), ``_setup_torch_process_group`` (gloo, or NCCL with GPUs) and, at the end,
``_shutdown_torch``; each worker's CUDA device is set by Ray's ``TorchConfigContextManager``. Ray's
TPU set-up (``tpu_dist``) is not here: raymodel does not train on TPUs. A gloo group over several
nodes uses each node's interface of its Ray address (``GLOO_SOCKET_IFNAME``, unless it is set).

Ray's private API used here: those functions and ``ray.train._internal.utils.get_address_and_port``;
check them when Ray is upgraded (``tests/test_training_run.py`` checks that they are there and that the
fields are ``TorchConfig``'s; every torch test runs them).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from ray.train.backend import Backend, BackendConfig

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ProcessGroup(BackendConfig):
    """``TorchConfig``'s fields: the torch.distributed ``backend`` (``None``: NCCL with GPUs, else gloo),
    ``init_method`` (``"env"`` or ``"tcp"``) and ``timeout_s`` for collective operations."""

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    @property
    def backend_cls(self) -> type:
        return _ProcessGroupBackend

    @property
    def train_func_context(self) -> type:
        return _WorkerDevice

    @property
    def framework(self) -> Any:
        from ray.train.v2._internal.util import TrainingFramework

        return TrainingFramework.TORCH

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _ProcessGroupBackend(Backend):
    """On the run's controller: what ``_TorchBackend.on_start`` and ``on_shutdown`` do, told to the workers."""

    share_cuda_visible_devices = True  # as Ray's: a worker sees its node's other workers' GPUs (NCCL needs them)

    def on_start(self, worker_group: Any, backend_config: Any) -> None:  # a ProcessGroup
        import ray
        from ray._common.network_utils import build_address
        from ray.train._internal.utils import get_address_and_port

        if backend_config.init_method not in ("env", "tcp"):
            raise ValueError(
                f"The provided init_method ({backend_config.init_method}) is not supported. "
                "Must be either 'env' or 'tcp'."
            )
        backend = backend_config.backend
        if backend is None:
            backend = "nccl" if worker_group.get_resources_per_worker().get("GPU", 0) > 0 else "gloo"
        address, port = worker_group.execute_single(0, get_address_and_port)
        if backend_config.init_method == "env":
            worker_group.execute(_set_master, address=address, port=port)
            url = "env://"
        else:
            url = f"tcp://{build_address(address, port)}"
        worker_group.execute(_set_distributed_env_vars)
        if backend == "gloo" and len(set(worker_group.execute(_node_ip))) > 1:
            worker_group.execute(_gloo_on_node_interface)
        size = len(worker_group)
        ray.get(
            [
                worker_group.execute_single_async(
                    rank,
                    _setup_process_group,
                    backend=backend,
                    world_rank=rank,
                    world_size=size,
                    init_method=url,
                    timeout_s=backend_config.timeout_s,
                )
                for rank in range(size)
            ]
        )

    def on_shutdown(self, worker_group: Any, backend_config: Any) -> None:
        import ray
        from ray._private import ray_constants
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import (
            DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
        )

        futures = worker_group.execute_async(_shutdown, destroy_process_group=len(worker_group) > 1)
        timeout_s = ray_constants.env_integer(
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S
        )
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            logger.warning(f"Torch process group shutdown timed out after {timeout_s} seconds")


class _WorkerDevice:
    """Around the training function on each worker: Ray's ``TorchConfigContextManager`` (the worker's
    CUDA device made the default one; nothing without GPUs)."""

    def __enter__(self) -> None:
        from ray.train.torch.config import TorchConfigContextManager

        self._ray = TorchConfigContextManager()
        self._ray.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        return bool(self._ray.__exit__(*exc))


# ------------------------------------------------------------------ on each worker (torch loaded there)
def _set_master(address: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = address
    os.environ["MASTER_PORT"] = str(port)


def _node_ip() -> str:
    import ray

    return str(ray.util.get_node_ip_address())


def _gloo_on_node_interface() -> None:
    """Gloo on the network interface that holds this node's Ray address, unless ``GLOO_SOCKET_IFNAME``
    names one: left to itself, gloo takes the address the host's name resolves to, which is a loopback
    address on many machines (Debian's /etc/hosts), and workers on other nodes cannot reach it."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    import psutil

    ip = _node_ip()
    for name, addresses in psutil.net_if_addrs().items():
        if any(address.address == ip for address in addresses):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


def _set_distributed_env_vars() -> None:
    from ray.train.torch.config import _set_torch_distributed_env_vars

    _set_torch_distributed_env_vars()


def _setup_process_group(**kwargs: Any) -> None:
    from ray.train.torch.config import _setup_torch_process_group

    _setup_torch_process_group(**kwargs)


def _shutdown(destroy_process_group: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy_process_group)
