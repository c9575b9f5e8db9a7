"""What a gradient step did, against a reference step: the tests that run a script's own loop (tests/probe.py with
`grads=[...]`) record each backward()'s gradients; these helpers compute the gradient of a plain, independently written
loss on the same minibatch and parameters, in float64, and compare.

    params = leaves(entry["actor"])                       # float64 copies that require grad
    loss = reference_actor_loss(params, entry["batch"])   # targets held constant, as the paper holds them
    assert_gradients_match(entry["grads"]["actor"], gradients(loss, params), where=f"update {k}")

Why gradients and not only loss values: a target that leaks its gradient leaves the loss value unchanged, and a term
weighted 1e-4 moves the value by less than any tolerance a loss comparison can afford; both change the gradient by far
more than float32 rounding does. Why gradients and not only the parameters after the step: Adam divides by the
gradient's running magnitude, so its first steps are nearly lr * sign(g), blind to a small term.

The comparison is per tensor, in norms: ||g - g_ref|| <= rtol * ||g_ref|| + floor, with the floor a small fraction of
the largest reference gradient compared (so that a tensor with almost no gradient is not judged on rounding alone).
A recorded None (no gradient reached the tensor) counts as zeros. Every recorded tensor (a module's parameters) is
compared; reference tensors with no recorded gradient (a state dict's buffers) are not.
"""

from __future__ import annotations

import torch

# float32 arithmetic against a float64 reference: per-tensor relative errors seen here are 1e-7 to 1e-6 for the
# MLPs and 1e-6 to 3e-6 for the convolutional networks; a 1e-4-weighted term or a leaked target moves them by 1e-4 and
# more. Tests that need another bound say why beside it.
RTOL = 2e-5
# Of the largest reference gradient's norm: a gradient that is zero in exact arithmetic (an attention key's bias) comes
# out of float32 at ~1e-9 of the largest; below 1e-3 of it, a tensor is judged on its absolute error.
FLOOR = 1e-3


def leaves(state: dict, only=None, dtype=torch.float64) -> dict:
    """Copies of a state dict's floating tensors as `dtype` leaves that require grad (`only`: a predicate on the
    name, to differentiate some and hold the rest constant); other entries copied unchanged."""
    out = {}
    for name, value in state.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            out[name] = value.detach().to(dtype).clone().requires_grad_(only is None or bool(only(name)))
        else:
            out[name] = value
    return out


def gradients(loss: torch.Tensor, params: dict) -> dict:
    """d loss / d each of `params` that requires grad (zeros where the loss does not depend on it)."""
    names = [name for name, value in params.items() if isinstance(value, torch.Tensor) and value.requires_grad]
    found = torch.autograd.grad(loss, [params[name] for name in names], allow_unused=True)
    return {
        name: (torch.zeros_like(params[name]) if grad is None else grad.detach()) for name, grad in zip(names, found)
    }


def gradient_errors(recorded: dict, reference: dict, floor: float = FLOOR) -> dict:
    """Per tensor of `reference`: ||recorded - reference|| / (||reference|| + floor * the largest reference norm)."""
    largest = max((grad.double().norm().item() for name, grad in reference.items() if name in recorded), default=0.0)
    assert largest > 0, "the reference gradient is zero everywhere: the check would prove nothing"
    errors = {}
    for name in recorded:
        assert name in reference, f"{name} has a recorded gradient but no reference one"
    for name, expected in reference.items():
        if name not in recorded:  # a buffer (running statistics, action scale): not a parameter
            continue
        got = recorded[name]
        got = torch.zeros_like(expected) if got is None else got.double().reshape(expected.shape)
        expected = expected.double()
        errors[name] = ((got - expected).norm() / (expected.norm() + floor * largest)).item()
    return errors


def assert_gradients_match(recorded: dict, reference: dict, where: str = "", rtol: float = RTOL) -> float:
    """Every tensor's recorded gradient within rtol (relative, in norm) of the reference; the largest error."""
    errors = gradient_errors(recorded, reference)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= rtol, (
        f"{where}: gradient of {worst} off by {errors[worst]:.2e} of its norm "
        f"(tolerance {rtol:.0e}; norm {reference[worst].double().norm().item():.3e}); "
        + ", ".join(f"{name} {error:.1e}" for name, error in errors.items() if error > rtol)
    )
    return errors[worst]


def assert_unchanged(before: dict, after: dict, where: str = "", names=None) -> None:
    """The tensors of a state dict (`names`: a predicate, default all) are bitwise what they were."""
    for name, value in before.items():
        if names is not None and not names(name):
            continue
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, after[name]), f"{where}: {name} moved"


def assert_no_gradient(grads: dict, where: str = "") -> None:
    """No gradient reached these parameters (a module's recorded .grad by name): each is None, or zeros. For target
    networks, frozen critics and teachers, which no loss may train."""
    reached = [name for name, grad in grads.items() if grad is not None and grad.any()]
    assert not reached, f"{where}: {', '.join(reached)} got a gradient"


def assert_same_gradient(got, before, where: str = "") -> None:
    """A recorded .grad (a tensor, or a module's dict of them) is what an earlier backward() left: this backward added
    nothing to it (None stays None)."""
    if isinstance(got, dict):
        assert got.keys() == before.keys(), where
        for name in got:
            assert_same_gradient(got[name], before[name], f"{where}: {name}")
    elif got is None or before is None:
        assert got is None and before is None, f"{where}: a gradient appeared"
    else:
        assert torch.equal(got, before), f"{where}: the gradient changed"
