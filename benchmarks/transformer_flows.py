"""Class-conditional TarFlow on MNIST (or the 8×8 digits): bits/dim, Bayes accuracy, step time, samples.

Protocol: the reference notebook's architecture at width 64 (``patch 4, 4 blocks × 2 layers``,
about 0.43 M parameters on MNIST), class-conditional (10 classes), trained for a wall-clock budget
on **uniformly dequantised** images ``v = (x + u) / 256`` mapped to ``[-1, 1]`` (the map's log-det
``D log 2`` is counted), AdamW (betas 0.9/0.95, weight decay 1e-4), a linear warm-up then a cosine decay over the
wall-clock budget (``--schedule``), gradient clipping at 1, one thread. Reported:

* test bits/dim (:func:`flows.metrics.bits_per_dim` of the density on ``[0, 1]^D``, one
  dequantisation draw; ``_se`` its standard error over the images) on the first ``--eval-images``
  test images and, with ``--all-test``, all of them;
  an image whose float32 log-density overflows (a scale beyond ``e^±88``) is scored again in float64,
  and the number of such images is reported (``float64_rescored``);
* Bayes accuracy (:func:`flows.classify.bayes_classifier`, uniform prior, ``K`` passes) on the first
  ``--classify-images`` test images, scored the way the model was trained (dequantised inputs,
  plus the model's noise σ for a ``--noise-std`` model, whose accuracy on clean inputs, the
  reference notebook's way, is reported beside it), and FlowBack's one-pass gradient classifier
  (:func:`flows.classify.gradient_classifier`) on the same inputs;
* the median training step time and the number of steps;
* the time to draw 100 samples (10 per class; denoised by a Tweedie step for a noise model) and
  how many are finite; a 10 × 10 grid (``--out``), and with ``--guidance w`` a second grid drawn
  with classifier-free guidance of weight ``w`` from the same noise.

``--noise-std σ`` trains on Gaussian-noised images (TarFlow's sample-quality recipe; σ in
``[-1, 1]`` units on top of the dequantisation, so its bits/dim are those of a noised model).
``--align reverse|forward|detach`` adds REPA/FlowBack alignment
(:class:`flows.train.RepresentationAlignment`) of the blocks and layers ``--align-where`` with a
**stand-in encoder**: a small CNN classifier trained here on the training images for
``--encoder-seconds`` (not counted in the flow's budget) and frozen, standing in for a
foundation model such as DINOv2, which cannot be downloaded on these machines (``--encoder global``,
the default, sees the whole image from every feature; ``local`` only the feature's patch).
``--align-until f`` stops the alignment after the first fraction ``f`` of the budget and trains by
maximum likelihood alone from there (HASTE's early stop: Wang et al. 2025, "REPA Works Until It
Doesn't: Early-Stopped, Holistic Alignment Supercharges Diffusion Training", arXiv:2505.16792).

The reference code (apple/ml-tarflow) is not run by this script; run it unchanged from a scratch
folder and compare at the same budget.

    python benchmarks/transformer_flows.py                              # MNIST, 10 minutes
    python benchmarks/transformer_flows.py --data digits --seconds 60 --patch 2 --out /tmp/tarflow
    python benchmarks/transformer_flows.py --noise-std 0.1 --label-dropout 0.1      # TarFlow's noise recipe
    python benchmarks/transformer_flows.py --align reverse                          # FlowBack (R-REPA)
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
from pathlib import Path

import _harness
import torch
from torch import nn

import flows
from flows.classify import bayes_classifier, gradient_classifier
from flows.data import DIGITS_LEVELS, MNIST_LEVELS, load_digits, load_mnist, uniform_dequantize
from flows.metrics import bits_per_dim
from flows.train import RepresentationAlignment


def load(name: str, data_dir: str | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``(train images, train labels, test images, test labels, levels)``, images ``(N, 1, H, W)`` uint8."""
    if name == "digits":
        (x_tr, y_tr), (x_te, y_te) = load_digits(image=True, labels=True)
        return x_tr, y_tr, x_te, y_te, DIGITS_LEVELS
    (x_tr, y_tr), (x_te, y_te) = load_mnist(data_dir, labels=True)
    return x_tr, y_tr, x_te, y_te, MNIST_LEVELS


def to_model(v: torch.Tensor) -> torch.Tensor:
    """``[0, 1]`` → ``[-1, 1]`` (log-det ``D log 2``, added back by :func:`log_density`)."""
    return 2 * v - 1


def log_density(flow: flows.TarFlow, v: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """log-density of dequantised images ``v`` in ``[0, 1]^D``."""
    dims = v[0].numel()
    return flow.log_prob(to_model(v), context=flow.class_context(y)) + dims * math.log(2)


class StandInEncoder(nn.Module):
    """A small CNN classifier trained here on the training images, then frozen.

    It **stands in for a foundation model** (DINOv2 and the like cannot be downloaded on these
    machines): ``forward`` returns its convolutional feature maps ``(B, width, H/p, W/p)`` on the
    flow's patch grid, ``head`` classifies them (used only to train it).

    ``kind="local"`` is one 3×3 convolution and one ``p × p`` patch convolution: each feature sees
    its own patch and a pixel around it (a ``(p + 2)²`` receptive field), so it says little the
    flow's token does not already hold. ``kind="global"`` (the default) is closer to what a
    foundation model gives: stride-2 3×3 convolutions down to the patch grid, then ``depth`` more
    3×3 convolutions on the grid, so each feature sees far beyond its patch (a 33-pixel square
    at patch 4 and ``depth=3``, more than an MNIST image's 28) and carries what the digit is, not
    only what its patch looks like.
    """

    def __init__(self, patch: int, width: int = 32, classes: int = 10, kind: str = "global", depth: int = 3) -> None:
        super().__init__()
        if kind == "local":
            layers = [nn.Conv2d(1, width, 3, padding=1), nn.SiLU()]
            layers += [nn.Conv2d(width, width, patch, stride=patch), nn.SiLU()]
        elif kind == "global":
            layers, stride, channels = [nn.Conv2d(1, width, 3, padding=1), nn.SiLU()], 1, width
            while patch % (stride * 2) == 0:  # halve towards the patch grid, then pool the odd factor left
                layers += [nn.Conv2d(channels, width, 3, stride=2, padding=1), nn.SiLU()]
                stride *= 2
            if stride != patch:
                layers.append(nn.AvgPool2d(patch // stride))
            for _ in range(depth):
                layers += [nn.Conv2d(width, width, 3, padding=1), nn.SiLU()]
        else:
            raise ValueError(f"encoder kind must be 'local' or 'global', got {kind!r}")
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


def clean(images: torch.Tensor, levels: int) -> torch.Tensor:
    """Grey levels → ``[-1, 1]`` without noise (what the encoder sees)."""
    return to_model(images.float() / (levels - 1))


def train_encoder(images, labels, levels: int, args: argparse.Namespace) -> tuple[StandInEncoder, float]:
    """The stand-in encoder trained by cross-entropy for ``args.encoder_seconds``; returns it frozen and its steps."""
    torch.manual_seed(args.seed)
    encoder = StandInEncoder(args.patch, args.encoder_width, kind=args.encoder)
    optimizer = torch.optim.Adam(encoder.parameters(), lr=2e-3)
    generator = torch.Generator().manual_seed(args.seed + 2)
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < args.encoder_seconds:
        index = torch.randint(len(images), (128,), generator=generator)
        logits = encoder.head(encoder(clean(images[index], levels)))
        loss = nn.functional.cross_entropy(logits, labels[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps += 1
    return encoder.eval().requires_grad_(False), steps


def model_inputs(images, levels: int, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """Dequantised images in ``[-1, 1]``, plus Gaussian noise ``σ`` for a noise-augmented model."""
    x = to_model(uniform_dequantize(images, levels, generator=generator))
    return x + sigma * torch.randn(x.shape, generator=generator) if sigma else x


def alignment(args: argparse.Namespace, encoder: nn.Module | None) -> RepresentationAlignment | None:
    if encoder is None:
        return None
    where = [tuple(int(v) for v in pair.split(":")) for pair in args.align_where.split(",")]
    return RepresentationAlignment(
        encoder,
        where=where,
        route=args.align,
        weight=args.align_weight,
        width=args.width,
        features=args.encoder_width,
        projector_width=args.projector_width or args.width,
    )


def learning_rate(args: argparse.Namespace, step: int, elapsed: float) -> float:
    """The learning rate at ``step``, ``elapsed`` seconds into training.

    A linear warm-up over ``args.warmup`` steps, then constant or (``--schedule cosine``) a cosine
    decay to 0 over the **wall-clock** budget, ``lr · ½(1 + cos(π t / budget))`` (the reference's
    cosine, in time rather than steps, since the budget is a time).
    """
    warm = min(1.0, (step + 1) / args.warmup)
    if args.schedule == "constant":
        return args.lr * warm
    return args.lr * warm * 0.5 * (1 + math.cos(math.pi * min(1.0, elapsed / args.seconds)))


def train(flow: flows.TarFlow, images, labels, levels: int, args: argparse.Namespace, align=None) -> list[float]:
    """Train for ``args.seconds`` of wall clock; returns the step times."""
    parameters = [*flow.parameters(), *(align.projector.parameters() if align is not None else ())]
    optimizer = torch.optim.AdamW(parameters, lr=args.lr, betas=(0.9, 0.95), weight_decay=1e-4)
    generator = torch.Generator().manual_seed(args.seed)
    dims, times, step, start = images[0].numel(), [], 0, time.perf_counter()
    grid = (images.shape[-2] // args.patch, images.shape[-1] // args.patch)
    flow.train()
    while time.perf_counter() - start < args.seconds:
        t0 = time.perf_counter()
        index = torch.randint(len(images), (args.batch,), generator=generator)
        x = model_inputs(images[index], levels, args.noise_std, generator)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(args, step, time.perf_counter() - start)
        context = flow.class_context(labels[index])
        if align is None or time.perf_counter() - start >= args.align_until * args.seconds:
            loss = -(flow.log_prob(x, context) + dims * math.log(2)).mean() / dims
        else:  # the NLL per dimension plus λ times the alignment term, in one pass
            log_p, states = align.hidden_states(flow, x, context)
            targets = align.targets(clean(images[index], levels), grid)
            loss = -(log_p + dims * math.log(2)).mean() / dims + align.weight * align.alignment_loss(states, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        times.append(time.perf_counter() - t0)
        step += 1
        if args.verbose and step % 100 == 0:
            print(f"step {step}  loss/dim {loss.item():.4f}  {time.perf_counter() - start:.0f} s", flush=True)
    return times


@torch.no_grad()
def evaluate(flow: flows.TarFlow, images, labels, levels: int, args: argparse.Namespace) -> dict[str, float]:
    flow.eval()
    generator = torch.Generator().manual_seed(args.seed + 1)
    dims = images[0].numel()

    wide = copy.deepcopy(flow).double()
    overflowed = {}

    def bpd(n: int) -> float:
        values, redone = [], 0
        for i in range(0, n, 500):
            v = uniform_dequantize(images[i : i + 500], levels, generator=generator)
            log_p = log_density(flow, v, labels[i : i + 500])
            bad = ~torch.isfinite(log_p)  # a float32 overflow (a scale beyond e^±88): score those rows in float64
            if bad.any():
                log_p[bad] = log_density(wide, v[bad].double(), labels[i : i + 500][bad]).to(log_p.dtype)
                redone += int(bad.sum())
            values.append(bits_per_dim(log_p, dims, levels))
        overflowed[n] = redone
        per_image = torch.cat(values).double()
        return per_image.mean().item(), (per_image.std() / math.sqrt(len(per_image))).item()

    n_eval = min(args.eval_images, len(images))
    mean, se = bpd(n_eval)
    result = {"bits_per_dim": mean, "bits_per_dim_se": se, "eval_images": n_eval}
    result["float64_rescored"] = overflowed[n_eval]
    if args.all_test:
        result["bits_per_dim_all"], result["bits_per_dim_all_se"] = bpd(len(images))
        result["float64_rescored_all"] = overflowed[len(images)]
    n_cls = min(args.classify_images, len(images))
    x = model_inputs(images[:n_cls], levels, 0.0, generator)  # scored as trained: noised with the model's σ
    noise = "model" if flow.noise_std else None
    predicted = bayes_classifier(flow, x, flow.num_classes, noise_std=noise, generator=generator).argmax(-1)
    result["bayes_accuracy"] = (predicted == labels[:n_cls]).double().mean().item()
    if flow.noise_std:  # the reference notebook's way, for comparison: clean inputs to a noise-trained model
        predicted = bayes_classifier(flow, x, flow.num_classes).argmax(-1)
        result["bayes_accuracy_clean"] = (predicted == labels[:n_cls]).double().mean().item()
    noised = x + flow.noise_std * torch.randn(x.shape, generator=generator) if flow.noise_std else x
    predicted = gradient_classifier(flow, noised, flow.num_classes).argmax(-1)
    result["gradient_accuracy"] = (predicted == labels[:n_cls]).double().mean().item()
    result["classify_images"] = n_cls
    y = flow.class_context(torch.arange(100) % 10)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    x = flow.sample(context=y, denoise=True if flow.noise_std else None)
    result["sample_100_s"] = time.perf_counter() - t0
    result["finite_samples"] = int(torch.isfinite(x.flatten(1)).all(1).sum())
    result["samples"] = x
    if args.guidance:  # classifier-free guidance (TarFlow's), from the same noise seed
        torch.manual_seed(args.seed)
        x = flow.sample(context=y, denoise=True if flow.noise_std else None, guidance=args.guidance)
        result["finite_guided"] = int(torch.isfinite(x.flatten(1)).all(1).sum())
        result["guided"] = x
    return result


def sample_grid(samples: torch.Tensor, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    v = ((samples.nan_to_num(0.0).clamp(-1, 1) + 1) / 2).squeeze(1)  # (100, H, W), column k: class k
    grid = v.reshape(10, 10, *v.shape[1:]).permute(0, 2, 1, 3).reshape(10 * v.shape[1], 10 * v.shape[2])
    fig, ax = plt.subplots(figsize=(6, 6))
    ax.imshow(grid.numpy(), cmap="gray_r", vmin=0, vmax=1)
    ax.set_axis_off()
    ax.set_title(title)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = _harness.parser(__doc__)
    p.add_argument("--data", choices=["mnist", "digits"], default="mnist")
    p.add_argument("--data-dir", default=None, help="folder holding mnist.npz (default: $FLOWS_DATA_DIR)")
    p.add_argument("--seconds", type=float, default=600.0, help="training wall clock (default: 10 minutes)")
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--scale", default="exp", choices=["exp", "softplus", "sigmoid"])
    p.add_argument("--label-dropout", type=float, default=0.0)
    p.add_argument("--noise-std", type=float, default=0.0, help="Gaussian noise augmentation σ in [-1, 1] units")
    p.add_argument("--align", default="none", choices=["none", "reverse", "forward", "detach"])
    p.add_argument("--align-weight", type=float, default=0.5)
    p.add_argument(
        "--align-until",
        type=float,
        default=1.0,
        help="align only in this first fraction of the budget, then maximum likelihood alone (HASTE's early stop)",
    )
    p.add_argument(
        "--align-where", default="-1:1", help="aligned block:layer pairs (default: layer 1 of the block nearest z)"
    )
    p.add_argument(
        "--projector-width", type=int, default=None, help="hidden width of the alignment projector (default: --width)"
    )
    p.add_argument("--encoder-seconds", type=float, default=60.0, help="training time of the stand-in encoder")
    p.add_argument("--encoder-width", type=int, default=32)
    p.add_argument(
        "--encoder",
        choices=["global", "local"],
        default=None,
        help="the stand-in encoder's receptive field (see StandInEncoder; default global)",
    )
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    p.add_argument("--schedule", choices=["cosine", "constant"], default="cosine", help="after the warm-up")
    p.add_argument("--eval-images", type=int, default=2000)
    p.add_argument("--all-test", action="store_true", help="also score every test image")
    p.add_argument("--classify-images", type=int, default=500)
    p.add_argument("--out", default=None, help="folder for the sample grid")
    p.add_argument("--guidance", type=float, default=0.0, help="also draw 100 samples with this guidance weight")
    p.add_argument("--save", default=None, help="write the trained flow here (flows.save_model)")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    if not 0 < args.align_until <= 1:
        p.error(f"--align-until: expected a fraction in (0, 1], got {args.align_until}")
    if args.align == "none" and (args.align_until != 1 or args.encoder is not None):
        p.error("--align-until and --encoder set up the alignment: expected them with --align")
    args.encoder = args.encoder or "global"
    return _harness.setup(args)


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse(argv)
    torch.manual_seed(args.seed)
    x_tr, y_tr, x_te, y_te, levels = load(args.data, args.data_dir)
    flow = flows.TarFlow(
        tuple(x_tr.shape[1:]),
        patch=args.patch,
        transforms=args.blocks,
        hidden=(args.width,) * args.layers,
        num_classes=10,
        scale=args.scale,
        label_dropout=args.label_dropout,
        noise_std=args.noise_std or None,
    )
    parameters = sum(p.numel() for p in flow.parameters())
    encoder_steps = None
    if args.align != "none":
        encoder, encoder_steps = train_encoder(x_tr, y_tr, levels, args)
        with torch.no_grad():  # how much the stand-in knows: its own accuracy on the classified test images
            n = min(args.classify_images, len(x_te))
            encoder_accuracy = (encoder.head(encoder(clean(x_te[:n], levels))).argmax(-1) == y_te[:n]).double().mean()
        align = alignment(args, encoder)
    else:
        align = None
    torch.manual_seed(args.seed)
    times = train(flow, x_tr, y_tr, levels, args, align)
    if args.save:
        flows.save_model(flow, args.save)
    result = evaluate(flow, x_te, y_te, levels, args)
    samples, guided = result.pop("samples"), result.pop("guided", None)
    result.update(steps=len(times), median_step_s=statistics.median(times) if times else float("nan"))
    result["parameters"] = parameters
    if encoder_steps is not None:
        result["encoder_steps"] = encoder_steps
        result["encoder_accuracy"] = encoder_accuracy.item()
    print(f"TarFlow on {args.data}: {parameters:,} parameters, {args.threads} thread(s), {args.seconds:g} s budget")
    for key, value in result.items():
        print(f"  {key:18s} {value:.4g}" if isinstance(value, float) else f"  {key:18s} {value}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        title = f"TarFlow {args.data}, {result['bits_per_dim']:.3f} bits/dim; column k: class k"
        sample_grid(samples, out / f"tarflow_{args.data}_samples.png", title)
        if guided is not None:
            sample_grid(guided, out / f"tarflow_{args.data}_guided.png", f"{title}, guidance {args.guidance:g}")
    return result


if __name__ == "__main__":
    main()
