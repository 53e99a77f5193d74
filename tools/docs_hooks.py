"""MkDocs hooks: the CLI reference page is generated from the Typer app at build time.

A page containing the line ``<!-- securesaver-cli -->`` gets it replaced by one section per
command: usage, help text and a table of its arguments and options, read from the Click
command Typer builds, so the reference cannot drift from the code.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- securesaver-cli -->"


def render_cli_reference() -> str:
    """Markdown for every ``securesaver`` command, in the order the app registers them."""
    import typer.main

    from langgraph_securesaver.cli.main import app

    group: Any = typer.main.get_command(app)   # Typer's (vendored) Click group
    ctx = group.context_class(group, info_name="securesaver")
    out = [str(group.help or "").strip(), ""]
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        sub = command.context_class(command, info_name=name, parent=ctx)
        usage = " ".join(command.collect_usage_pieces(sub))
        out += [f"## `securesaver {name}`", "", (command.help or "").strip(), "",
                "```text", f"securesaver {name} {usage}".rstrip(), "```", ""]
        rows = []
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            if param.param_type_name == "argument":
                names = f"`{str(param.name).upper()}`"
            else:
                names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
            help_text = " ".join(str(getattr(param, "help", "") or "").split())
            default = param.default
            if getattr(param, "is_flag", False):
                shown = "off" if not default else "on"
            elif default is None or default == () or callable(default):
                shown = ""
            else:
                shown = f"`{default}`"
            required = " (required)" if param.required else ""
            cell = help_text.replace("|", "\\|")
            rows.append(f"| {names}{required} | {cell} | {shown} |")
        if rows:
            out += ["| argument / option | meaning | default |", "| --- | --- | --- |", *rows, ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, **_kwargs: Any) -> str:
    """Expand the CLI marker (mkdocs hook)."""
    if MARKER in markdown:
        return markdown.replace(MARKER, render_cli_reference())
    return markdown
