"""Options and option parsers that several commands share."""

from __future__ import annotations

import click

from .client import DEFAULT_ADDRESS

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")

control_plane_option = click.option(
    "--control-plane",
    "address",
    default=DEFAULT_ADDRESS,
    show_default=True,
    envvar="DROVER_CONTROL_PLANE",
    help="host:port of the control plane.",
)


def parse_slowdowns(values, param, example: str, default_step: int | None = None) -> list[tuple[str, float, int]]:
    """DEVICE=RATE@STEP options as (device, rate, step); @STEP may be left out only with a default."""
    out = []
    for value in values:
        device, _, rest = value.partition("=")
        rate, at, step = rest.partition("@")
        try:
            rate_f = float(rate)
            step_i = int(step) if at or default_step is None else default_step
        except ValueError:
            raise click.BadParameter(f"{value!r}: expected DEVICE=RATE@STEP, e.g. {example}", param=param) from None
        if not device or not rate_f >= 1.0 or step_i < 0:
            raise click.BadParameter(f"{value!r}: RATE must be >= 1 and STEP >= 0", param=param)
        out.append((device, rate_f, step_i))
    return out
