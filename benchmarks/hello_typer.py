"""The start-up yardstick of benchmarks/bench_estimate.py: a hello-world typer app that prints a one-row rich table.

It pays what any typer + rich command pays (interpreter, typer and its option handling, rich, one table), nothing
more; `kvtool estimate` must stay within 1.5x of it.
"""

import typer

app = typer.Typer(add_completion=False)


@app.command()
def hello(model: str = typer.Option("llama-2-7b", "--model", help="A name to print.")) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="hello")
    table.add_column("model")
    table.add_column("KV bytes")
    table.add_row(model, "1,073,741,824")
    Console().print(table)


if __name__ == "__main__":
    app()
