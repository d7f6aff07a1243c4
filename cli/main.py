"""schedplan command line."""
import click

from .check import baseline, check
from .compare import compare
from .fit import fit
from .plot import plot
from .reserve import reserve
from .run import run
from .verify import verify


@click.group()
@click.version_option(package_name="schedplan")
def cli() -> None:
    """Exact plans of the memory llama.cpp reserves for a GGUF model.

    schedplan reads only the GGUF header, rebuilds llama.cpp's worst-case pp and tg graphs and runs
    its scheduler and allocator on them (llama.cpp 0c1e57098, as in llama-cpp-python 0.3.36).

    \b
      schedplan fit model.gguf --device cuda:24GiB:cc=8.9   what llama-server's --fit will choose
      schedplan reserve model.gguf -c 8192          what will be reserved, per buffer type
      schedplan reserve model.gguf --tensors        every tensor's buffer and offset
      schedplan verify model.gguf -c 8192           the plan against a real llama.cpp run
      schedplan baseline model.gguf -o base.json    then in CI: schedplan check ... --baseline base.json
    """


cli.add_command(fit)
cli.add_command(reserve)
cli.add_command(run)
cli.add_command(verify)
cli.add_command(baseline)
cli.add_command(check)
cli.add_command(compare)
cli.add_command(plot)
