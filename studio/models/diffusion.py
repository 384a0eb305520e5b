"""DDIM sampling with the LMDM cosine schedule, as in the reference.

Two samplers share one schedule:

- :func:`ddim_sample` is the reference loop, written for clarity.
- :class:`DeviceDDIM` keeps every constant, noise tensor and intermediate on the
  device and never reads a value back to the host inside the loop, so the whole
  loop can be captured in a CUDA graph. Both give identical results.

A *denoiser* is any callable ``(x, time_cond) -> (pred_noise, x_start)`` with
``x`` [B, S, D] float32 and ``time_cond`` [B] int64, exactly the interface of
the exported LMDM step (which includes classifier-free guidance). A network
that only predicts x0 is adapted with :func:`x0_denoiser`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from studio.layout import COSINE_S, DDIM_ETA, DIFFUSION_STEPS

Denoiser = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def cosine_betas(n_timestep: int = DIFFUSION_STEPS, s: float = COSINE_S) -> np.ndarray:
    """Cosine-schedule betas in float64, clipped to [0, 0.999] (reference make_beta_schedule).

    Computed on the host whatever the default device (a meta skeleton's too)."""
    steps = torch.arange(n_timestep + 1, dtype=torch.float64, device="cpu") / n_timestep + s
    alphas = torch.cos(steps / (1 + s) * np.pi / 2).pow(2)
    alphas = alphas / alphas[0]
    betas = 1 - alphas[1:] / alphas[:-1]
    return np.clip(betas.numpy(), 0.0, 0.999)


def alphas_cumprod(n_timestep: int = DIFFUSION_STEPS) -> torch.Tensor:
    """Cumulative product of (1 - beta), computed in float32 after the cast, as the reference."""
    betas = torch.tensor(cosine_betas(n_timestep), dtype=torch.float32, device="cpu")
    return torch.cumprod(1.0 - betas, dim=0)


def ddim_time_pairs(steps: int, n_timestep: int = DIFFUSION_STEPS) -> list[tuple[int, int]]:
    """(t, t_next) pairs: linspace(-1, n-1, T+1) in float32, truncated, reversed."""
    if steps < 1 or steps > n_timestep:
        raise ValueError(f"sampling steps must be in 1..{n_timestep}, got {steps}")
    times = torch.linspace(-1, n_timestep - 1, steps=steps + 1).int().tolist()
    times = list(reversed(times))
    return list(zip(times[:-1], times[1:], strict=True))


@dataclass(frozen=True)
class DDIMSchedule:
    """Per-step constants for T DDIM steps (float32 scalars, as the reference computes them)."""

    steps: int
    time_pairs: list[tuple[int, int]]
    alpha_next_sqrt: torch.Tensor  # [T-1]
    sigma: torch.Tensor  # [T-1]
    c: torch.Tensor  # [T-1]
    alphas_cumprod: torch.Tensor  # [n_timestep]

    @property
    def num_noises(self) -> int:
        """Stored noise tensors: one per non-final step."""
        return self.steps - 1


def make_schedule(steps: int, eta: float = DDIM_ETA) -> DDIMSchedule:
    """The reference's LMDM.setup(T).

    sigma = eta * sqrt((1 - a/a') (1 - a') / (1 - a)) and c = sqrt(1 - a' - sigma²).
    c² is clamped at 0: at t = 999 (a ≈ 0) it is zero in exact arithmetic but can round
    below it (T = 3 does), where the reference gets NaN motion.
    """
    ac = alphas_cumprod()
    pairs = ddim_time_pairs(steps)
    nxt, sig, cs = [], [], []
    for t, t_next in pairs:
        if t_next < 0:
            continue
        a, a_next = ac[t], ac[t_next]
        sigma = eta * ((1 - a / a_next) * (1 - a_next) / (1 - a)).sqrt()
        nxt.append(a_next.sqrt())
        sig.append(sigma)
        cs.append((1 - a_next - sigma**2).clamp_min(0).sqrt())
    return DDIMSchedule(steps, pairs, _stack(nxt), _stack(sig), _stack(cs), ac)


def _stack(values: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(values) if values else torch.zeros(0)


def draw_noises(
    schedule: DDIMSchedule,
    shape: tuple[int, ...],
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_T [shape], per-step noises [T-1, *shape]) drawn from N(0, I)."""
    x_t = torch.randn(shape, generator=generator, dtype=torch.float32)
    noises = torch.randn((schedule.num_noises, *shape), generator=generator, dtype=torch.float32)
    return x_t.to(device), noises.to(device)


def noise_tables(ac: torch.Tensor) -> torch.Tensor:
    """[2, n]: (1 - a_t)^-1/2 and sqrt(1/a_t - 1) for every t, computed once (reference buffers)."""
    return torch.stack([torch.sqrt(1.0 / (1.0 - ac)), torch.sqrt(1.0 / ac - 1)])


def predict_noise_from_start(
    x_t: torch.Tensor, time_cond: torch.Tensor, x0: torch.Tensor, tables: torch.Tensor
) -> torch.Tensor:
    """eps = x_t * (1 - a_t)^-1/2 - x0 / sqrt(1/a_t - 1), the reference's algebraic form.

    ``tables`` comes from :func:`noise_tables` and should live on x_t's device.
    """
    a = tables[0].gather(-1, time_cond)
    b = tables[1].gather(-1, time_cond)
    shape = (time_cond.shape[0],) + (1,) * (x_t.dim() - 1)
    return a.reshape(shape) * x_t - x0 / b.reshape(shape)


def ddim_next(
    x_start: torch.Tensor,
    pred_noise: torch.Tensor,
    alpha_next_sqrt: torch.Tensor,
    c: torch.Tensor,
    sigma: torch.Tensor,
    noise: torch.Tensor,
) -> torch.Tensor:
    """One DDIM update: x <- sqrt(a') x0 + c eps + sigma z (the step's scalars as tensors of
    one value, on x's device; every sampler's arithmetic, in this order)."""
    return x_start * alpha_next_sqrt + c * pred_noise + sigma * noise


def x0_denoiser(predict_x0: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Denoiser:
    """Adapt an x0-predicting network (the LMDM decoder with guidance) to a Denoiser."""
    tables = noise_tables(alphas_cumprod())

    def denoise(x: torch.Tensor, time_cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x0 = predict_x0(x, time_cond)
        return predict_noise_from_start(x, time_cond, x0, tables.to(x.device)), x0

    return denoise


def ddim_sample(
    denoiser: Denoiser, x_t: torch.Tensor, noises: torch.Tensor, schedule: DDIMSchedule
) -> torch.Tensor:
    """The reference DDIM loop: x <- sqrt(a') x0 + c eps + sigma z_i; the last step returns x0."""
    if noises.shape[0] != schedule.num_noises:
        raise ValueError(f"need {schedule.num_noises} noise tensors, got {noises.shape[0]}")
    x = x_t
    dev = x.device
    i = 0
    for t, t_next in schedule.time_pairs:
        time_cond = torch.full((x.shape[0],), t, dtype=torch.long, device=dev)
        pred_noise, x_start = denoiser(x, time_cond)
        if t_next < 0:
            x = x_start
            continue
        x = ddim_next(
            x_start,
            pred_noise,
            schedule.alpha_next_sqrt[i].to(dev),
            schedule.c[i].to(dev),
            schedule.sigma[i].to(dev),
            noises[i],
        )
        i += 1
    return x


class DeviceDDIM:
    """DDIM whose state lives on one device, with no host synchronization in the loop.

    Constants, timesteps and the stored noises are uploaded once; :meth:`sample`
    writes into a persistent output buffer, so the same tensors are reused run
    after run (what CUDA-graph capture needs). Results equal :func:`ddim_sample`.
    """

    def __init__(
        self,
        schedule: DDIMSchedule,
        shape: tuple[int, ...],
        noises: torch.Tensor,
        device: torch.device | str = "cpu",
    ) -> None:
        if tuple(noises.shape) != (schedule.num_noises, *shape):
            raise ValueError(
                f"noises must be {[schedule.num_noises, *shape]}, got {list(noises.shape)}"
            )
        self.schedule = schedule
        self.shape = tuple(shape)
        self.device = torch.device(device)
        batch = shape[0]
        self._final = [t_next < 0 for _, t_next in schedule.time_pairs]
        self.time_cond = torch.tensor(
            [[t] * batch for t, _ in schedule.time_pairs], dtype=torch.long, device=self.device
        )
        self.alpha_next_sqrt = schedule.alpha_next_sqrt.to(self.device)
        self.c = schedule.c.to(self.device)
        self.sigma = schedule.sigma.to(self.device)
        self.noises = noises.to(self.device, torch.float32).contiguous()
        self.out = torch.empty(self.shape, dtype=torch.float32, device=self.device)

    def sample(self, denoiser: Denoiser, x_t: torch.Tensor) -> torch.Tensor:
        """Run all steps from x_T; returns the persistent output buffer (copy it to keep it)."""
        x = x_t
        i = 0
        for step, final in enumerate(self._final):
            pred_noise, x_start = denoiser(x, self.time_cond[step])
            if final:
                x = x_start
                break
            x = ddim_next(
                x_start,
                pred_noise,
                self.alpha_next_sqrt[i],
                self.c[i],
                self.sigma[i],
                self.noises[i],
            )
            i += 1
        self.out.copy_(x)
        return self.out
