"""Figures are written to files without touching pyplot: a notebook that imports sae_lens_bae
keeps its backend (inline plots), and no figure is left open for it to display twice."""

import subprocess
import sys

import matplotlib.image
import pytest
import torch

SCRIPT = """
import matplotlib
matplotlib.use("svg")  # a backend a user chose (a notebook's would be inline)
import matplotlib.pyplot as plt
import sae_lens_bae, sae_lens_bae.plots, sae_lens_bae.experiments.synthetic  # noqa: F401
print(matplotlib.get_backend())
"""


@pytest.mark.slow
def test_importing_the_package_keeps_the_users_backend():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "svg"


def test_a_saved_figure_leaves_no_pyplot_figure_open(tmp_path):
    import matplotlib.pyplot as plt

    from sae_lens_bae.plots import plot_firing_frequencies

    before = plt.get_fignums()
    frequencies = {"bae": torch.linspace(0, 1, 64), "topk": torch.linspace(0, 0.1, 64)}
    counts = {name: {"latents": 64, "dead": 1, "dense": 0} for name in frequencies}
    path = plot_firing_frequencies(frequencies, tmp_path / "firing.png", counts, 0.1)
    assert plt.get_fignums() == before
    assert matplotlib.image.imread(path).shape[2] == 4  # a real RGBA PNG


def test_entropy_trace_draws_ceilings_and_keeps_the_error_colour_of_unreliable_cells():
    from matplotlib import colormaps

    from sae_lens_bae.plots import entropy_curves_figure

    rows = [
        {"position": 1, "layer": 5, "bits": 1.6, "bits_std": 0.1, "relative_error": 0.0,
         "ceiling_bits": 9.0, "reliable": True},
        {"position": 2, "layer": 5, "bits": 11.0, "bits_std": 0.3, "relative_error": 0.5,
         "ceiling_bits": 9.8, "reliable": False},
        {"position": 4, "layer": 5, "bits": 16.0, "bits_std": 3.0, "relative_error": 0.25,
         "ceiling_bits": 9.9, "reliable": False},
    ]  # fmt: skip
    fig = entropy_curves_figure(rows, x="position", curve="layer", xlabel="position",
                                curve_label="layer")  # fmt: skip
    ax = fig.axes[0]
    ceilings = [line for line in ax.lines if line.get_gid() == "ceiling"]
    assert len(ceilings) == 1
    assert list(ceilings[0].get_ydata()) == [9.0, 9.8, 9.9]
    (rings,) = [c for c in ax.collections if c.get_gid() == "unreliable"]
    (filled,) = [c for c in ax.collections if c.get_gid() == "reliable"]
    viridis = colormaps["viridis"]
    # errors 0.5 and 0.25 on a 0..0.5 scale: the ends and the middle of the colour map
    assert rings.get_edgecolors().tolist() == [list(viridis(1.0)), list(viridis(0.5))]
    assert rings.get_facecolors().shape[0] == 0  # hollow
    assert filled.get_facecolors().tolist() == [list(viridis(0.0))]
    labels = ax.get_legend_handles_labels()[1]
    assert "ceiling: log2(states)" in labels
    assert "unreliable cell (ring)" in labels
    assert not [line for line in ax.lines if line.get_gid() == "reference"]


def test_entropy_trace_draws_the_kmeans_reference_filled_where_it_passes():
    from matplotlib.colors import to_rgba

    from sae_lens_bae.plots import entropy_curves_figure

    rows = [
        {"position": 1, "layer": 5, "bits": 1.6, "relative_error": 0.0, "reliable": True,
         "reference_bits": 4.1, "reference_reads_cell": True},
        {"position": 2, "layer": 5, "bits": 11.0, "relative_error": 0.5, "reliable": False,
         "reference_bits": 8.7, "reference_reads_cell": False},
        {"position": 4, "layer": 5, "bits": 16.0, "relative_error": 0.25, "reliable": False},
    ]  # fmt: skip
    fig = entropy_curves_figure(rows, x="position", curve="layer", xlabel="position",
                                curve_label="layer")  # fmt: skip
    ax = fig.axes[0]
    (line,) = [line for line in ax.lines if line.get_gid() == "reference"]
    assert list(line.get_xdata()) == [1, 2] and list(line.get_ydata()) == [4.1, 8.7]
    (squares,) = [c for c in ax.collections if c.get_gid() == "reference_points"]
    faces = squares.get_facecolors().tolist()
    assert faces[0] == list(to_rgba("C0")) and faces[1][3] == 0.0  # filled, then hollow
    labels = ax.get_legend_handles_labels()[1]
    assert any(label.startswith("k-means reference") for label in labels)
