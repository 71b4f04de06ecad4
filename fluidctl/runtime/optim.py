"""Optimizers as plain update rules on arrays (numpy or cupy), shared by trainers (collective
mode) and parameter servers (pserver mode).

An optimizer is described by a small dict (``config()``), so a trainer can tell a parameter
server which rule to apply without sending code: ``from_config`` rebuilds it on the other side.
Updates are in place and keep the parameter's dtype (float32 stays float32).
"""
from __future__ import annotations

from typing import Dict

import numpy as np


class Optimizer:
    kind = "base"

    def __init__(self, lr: float = 0.01):
        if lr <= 0:
            raise ValueError(f"learning rate must be positive, got {lr}")
        self.lr = float(lr)
        self.state: Dict[str, dict] = {}

    def config(self) -> dict:
        return {"kind": self.kind, "lr": self.lr}

    def apply(self, name: str, param, grad) -> None:
        """Update ``param`` in place from ``grad`` (same shape; cast to param's dtype)."""
        raise NotImplementedError

    def state_arrays(self) -> Dict[str, object]:
        """Flat ``{name/slot: array}`` view of the optimizer state, for checkpoints."""
        return {f"{name}/{slot}": arr for name, slots in self.state.items()
                for slot, arr in slots.items() if hasattr(arr, "shape")}

    def load_state_arrays(self, arrays: Dict[str, object]) -> None:
        for key, arr in arrays.items():
            name, _, slot = key.rpartition("/")
            self.state.setdefault(name, {})[slot] = arr


class SGD(Optimizer):
    kind = "sgd"

    def apply(self, name, param, grad):
        param -= param.dtype.type(self.lr) * grad.astype(param.dtype, copy=False)


class Momentum(Optimizer):
    kind = "momentum"

    def __init__(self, lr: float = 0.01, momentum: float = 0.9, nesterov: bool = False):
        super().__init__(lr)
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)

    def config(self):
        return {**super().config(), "momentum": self.momentum, "nesterov": self.nesterov}

    def apply(self, name, param, grad):
        grad = grad.astype(param.dtype, copy=False)
        slots = self.state.setdefault(name, {})
        velocity = slots.get("velocity")
        if velocity is None:
            velocity = slots["velocity"] = grad.copy()
        else:
            velocity *= param.dtype.type(self.momentum)
            velocity += grad
        lr = param.dtype.type(self.lr)
        if self.nesterov:
            param -= lr * (grad + param.dtype.type(self.momentum) * velocity)
        else:
            param -= lr * velocity


class Adam(Optimizer):
    kind = "adam"

    def __init__(self, lr: float = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8):
        super().__init__(lr)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def config(self):
        return {**super().config(), "beta1": self.beta1, "beta2": self.beta2,
                "epsilon": self.epsilon}

    def apply(self, name, param, grad):
        grad = grad.astype(param.dtype, copy=False)
        slots = self.state.setdefault(name, {})
        if "m" not in slots:
            slots["m"] = param * 0
            slots["v"] = param * 0
            slots["t"] = np.zeros((), dtype=np.int64)  # an array, so checkpoints keep it
        slots["t"] += 1
        t = int(slots["t"])
        m, v, f = slots["m"], slots["v"], param.dtype.type
        m *= f(self.beta1)
        m += f(1 - self.beta1) * grad
        v *= f(self.beta2)
        v += f(1 - self.beta2) * grad * grad
        step = f(self.lr * (1 - self.beta2 ** t) ** 0.5 / (1 - self.beta1 ** t))
        param -= step * m / (v ** f(0.5) + f(self.epsilon))


KINDS = {cls.kind: cls for cls in (SGD, Momentum, Adam)}


def from_config(config: dict) -> Optimizer:
    """Rebuild an optimizer from ``Optimizer.config()`` (ValueError for an unknown kind)."""
    config = dict(config)
    kind = config.pop("kind", None)
    if kind not in KINDS:
        raise ValueError(f"unknown optimizer {kind!r}; known: {', '.join(sorted(KINDS))}")
    return KINDS[kind](**config)
