"""The output buffer and line helpers every assembly generator here (asmgen_*.py) shares.

Each generator runs as its own process from this directory, appends its lines to ``out``
through ``w`` / ``ins`` and prints ``out`` at the end.
"""

out = []


def w(line=""):
    """Append one line (a label, directive or comment) as is."""
    out.append(line)


def ins(*lines):
    """Append instructions, each indented by one tab."""
    for line in lines:
        w("\t" + line)


def off(o):
    """An address offset as Go assembly writes it: nothing for 0."""
    return "" if o == 0 else str(o)
