"""The trainer's guard against NaN and inf: a step with a non-finite loss or gradient is skipped (and too many
in a row stop the run), and weights that hold one are neither published nor saved. Sharded, the ranks agree."""

from __future__ import annotations

import torch

from laminar.trainer.publish import local_rows


class NonFiniteError(RuntimeError):
    """Weights, a loss or a gradient holds NaN or inf."""


class FiniteChecks:
    """`Trainer`'s non-finite checks (reads `model`, `cfg`, `version`, `publish_dtype` and `world`)."""

    def _count_nonfinite(self, nonfinite: bool, losses: list[float], grad_norms: list[float]) -> None:
        if not nonfinite:
            self.nonfinite_in_a_row = 0
            return
        self.nonfinite_steps += 1
        self.nonfinite_in_a_row += 1
        if self.nonfinite_in_a_row >= self.cfg.max_nonfinite_steps:
            raise NonFiniteError(
                f"{self.nonfinite_in_a_row} trainer steps in a row had a non-finite loss or gradient norm (step "
                f"{self.version + 1}: loss {losses[-1]}, grad norm {grad_norms[-1]}); they were skipped and the "
                "weights are unchanged. Look for non-finite rewards or log-probs, or lower trainer.lr "
                f"(trainer.max_nonfinite_steps={self.cfg.max_nonfinite_steps} is how many are skipped first)"
            )

    def check_finite(self) -> None:
        """Raise `NonFiniteError` naming the first parameter that holds NaN or inf (before a publish or save).
        Sharded: every rank checks its shards and the ranks agree."""
        self.raise_nonfinite(self.nonfinite_flags())

    @torch.no_grad()
    def nonfinite_flags(self) -> torch.Tensor:
        """One flag a parameter (this rank's rows), 1 where it holds NaN or inf; computed on the parameters'
        device without waiting for it, so a publish can copy its weights out meanwhile and judge them after.
        One min-max reduction a parameter (NaN propagates through both, inf shows in one): no copy the size of
        the weights, and one more kernel for them all."""
        params = self._parameters()
        zero = torch.zeros((), device=params[0][1].device)  # stands in for an empty shard's ends
        ends = [v for _, x in params for v in (torch.aminmax(x) if x.numel() else (zero, zero))]
        return (~torch.isfinite(torch.stack(ends).float()).view(-1, 2).all(1)).int()

    def _parameters(self) -> list[tuple[str, torch.Tensor]]:
        """(name, this rank's rows) of every parameter, the local tensors (a sharded parameter's own shard),
        resolved once: the optimizer and checkpoint loads update them in place."""
        if self._locals is None:
            self._locals = [(n, local_rows(p)) for n, p in self.model.named_parameters()]
        return self._locals

    def raise_nonfinite(self, flags: torch.Tensor, summary: bool = False) -> None:
        """Raise `NonFiniteError` if `nonfinite_flags` (or, `summary`, `published_nonfinite`) found any.
        Sharded: an all-reduce over the ranks, so every rank raises (or not) alike; it returns only once every
        rank has called it, which makes it the publish's barrier too. Waits for the device once. A set summary
        is followed by the per-parameter flags on every rank, to name what is wrong."""
        flags = self._agree(flags)
        if summary:
            if not bool(flags.any()):
                return
            flags = self._agree(self.nonfinite_flags())  # which parameters
        bad_at = flags.nonzero().flatten().tolist()
        if not bad_at:
            if not summary:
                return
            raise NonFiniteError(  # finite in fp32, not once cast
                f"the trainer's weights at version {self.version} overflow {self.publish_dtype} "
                "(publish_dtype): values beyond its range become inf; they are not published"
            )
        bad = [self._parameters()[i][0] for i in bad_at]
        raise NonFiniteError(
            f"the trainer's weights hold NaN or inf at version {self.version} (parameter {bad[0]!r}"
            f"{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}); they are neither published nor saved"
        )

    def _agree(self, flags: torch.Tensor) -> torch.Tensor:
        """The ranks' flags, each the largest any rank holds (one all-reduce); a single trainer's as they are."""
        if self.world > 1:
            import torch.distributed as dist

            if dist.get_backend() == "nccl" and not flags.is_cuda:  # parameters offloaded to the host
                flags = flags.cuda()
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return flags
