"""schedplan command line."""
import click

from schedplan.cli.check import baseline, check
from schedplan.cli.compare import compare
from schedplan.cli.plot import plot
from schedplan.cli.reserve import reserve
from schedplan.cli.run import run
from schedplan.cli.verify import verify


@click.group()
@click.version_option(package_name="schedplan")
def cli() -> None:
    """Exact plans of the memory llama.cpp reserves for a GGUF model."""


cli.add_command(reserve)
cli.add_command(run)
cli.add_command(verify)
cli.add_command(baseline)
cli.add_command(check)
cli.add_command(compare)
cli.add_command(plot)
