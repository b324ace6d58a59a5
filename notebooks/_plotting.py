"""What every notebook here shares: matplotlib's Agg backend at 80 dpi, and ``show(fig)``."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from IPython.display import Image, display  # noqa: E402

plt.rcParams.update({"figure.dpi": 80, "savefig.dpi": 80})


def show(fig) -> None:
    """Shows a figure as a PNG at 80 dpi (the Agg backend draws nothing by itself) and closes it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    display(Image(data=buf.getvalue()))
