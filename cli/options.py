"""Options and option parsers that several commands share."""

from __future__ import annotations

import functools

import click

from drover.planner.ports import host_port
from drover.planner.wire import is_loopback

from .client import DEFAULT_ADDRESS, Target

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def check_address(ctx, param, value: str | None) -> str | None:
    """A HOST:PORT option, refused before anything dials or binds it."""
    if value:
        try:
            host_port(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


address_option = click.option(
    "--control-plane",
    "address",
    default=DEFAULT_ADDRESS,
    show_default=True,
    envvar="DROVER_CONTROL_PLANE",
    callback=check_address,
    help="host:port of the control plane.",
)
insecure_option = click.option(
    "--insecure",
    is_flag=True,
    envvar="DROVER_INSECURE",
    help="No TLS and no credentials: for a control plane on loopback started with --insecure.",
)


def check_credentials(target: Target, ca: str, token_file: str) -> None:
    """Refused here, by option: gRPC took a CA file without a certificate, logged C-core lines and
    reported a control plane that did not answer."""
    from cryptography import x509  # here: 20 to 30 ms that every other command would pay

    try:
        x509.load_pem_x509_certificates(target.ca)
    except ValueError:
        raise click.BadParameter(
            f"{ca} holds no PEM certificate: give the cluster's CA (ca.pem of drover certs init)", param_hint="--ca"
        ) from None
    if not target.token:
        raise click.BadParameter(f"{token_file} is empty: give a token drover certs made", param_hint="--token-file")


def control_plane_option(command):
    """--control-plane with how to reach it, given to the command as one `address`: a Target."""

    @address_option
    @click.option(
        "--ca",
        type=click.Path(dir_okay=False, exists=True),
        envvar="DROVER_CA",
        help="The cluster's CA certificate (ca.pem of drover certs init).",
    )
    @click.option(
        "--token-file",
        type=click.Path(dir_okay=False, exists=True),
        envvar="DROVER_TOKEN_FILE",
        help="Your bearer token: reader.token, operator.token or admin.token of drover certs init "
        "(docs/security.md says which role each command needs).",
    )
    @insecure_option
    @functools.wraps(command)
    def with_target(*args, address: str, ca: str | None, token_file: str | None, insecure: bool, **kwargs):
        if insecure:
            target = Target(address)
            if not is_loopback(address):
                raise click.UsageError(f"--insecure reaches a loopback control plane only, not {address}")
        elif ca is None or token_file is None:
            raise click.UsageError(
                "give --ca and --token-file ($DROVER_CA, $DROVER_TOKEN_FILE; drover certs init makes them), "
                "or --insecure for a loopback control plane started with --insecure"
            )
        else:
            target = Target.from_files(address, ca, token_file)
            check_credentials(target, ca, token_file)
        return command(*args, address=target, **kwargs)

    return with_target


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


def environment_for_every_option(command: click.Command, prefix: str = "DROVER") -> None:
    """Every option of `command` and its subcommands reads an environment variable, shown in
    --help: its own where it names one (DROVER_CONTROL_PLANE, shared by many commands), else
    DROVER_<COMMAND PATH>_<OPTION> (drover job submit --out: DROVER_JOB_SUBMIT_OUT)."""
    for param in command.params:
        if isinstance(param, click.Option) and param.name not in ("help", "version"):
            if param.envvar is None:
                flag = max(param.opts, key=len).lstrip("-").replace("-", "_")
                param.envvar = f"{prefix}_{flag}".upper()
            param.show_envvar = True
    for name, sub in getattr(command, "commands", {}).items():
        environment_for_every_option(sub, f"{prefix}_{name.replace('-', '_')}")
