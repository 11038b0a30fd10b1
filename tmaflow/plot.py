"""Drawing for the ``plot`` extra: a matplotlib ``Figure`` with its own Agg canvas, never
through pyplot, so a notebook's or a script's backend and open figures are left alone."""
from __future__ import annotations

from .errors import TmaflowError


def figure(who: str, figsize: tuple[float, float]):
    """A ``matplotlib.figure.Figure`` that ``savefig`` writes with Agg; ``who`` names the
    caller in the TmaflowError raised when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # the optional plot extra
        from matplotlib.figure import Figure
    except ImportError:
        raise TmaflowError(f"{who} needs matplotlib (pip install 'tmaflow[plot]')") from None
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def colormap(name: str):
    """A registered matplotlib colormap, looked up without pyplot."""
    import matplotlib  # figure() was called first: matplotlib is installed

    return matplotlib.colormaps[name]
