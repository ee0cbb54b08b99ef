"""Figures are written to files without touching pyplot: a notebook that imports sae_lens_bae
keeps its backend (inline plots), and no figure is left open for it to display twice."""

import subprocess
import sys

import matplotlib.image
import torch

SCRIPT = """
import matplotlib
matplotlib.use("svg")  # a backend a user chose (a notebook's would be inline)
import matplotlib.pyplot as plt
import sae_lens_bae, sae_lens_bae.plots, sae_lens_bae.experiments.synthetic  # noqa: F401
print(matplotlib.get_backend())
"""


def test_importing_the_package_keeps_the_users_backend():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "svg"


def test_a_saved_figure_leaves_no_pyplot_figure_open(tmp_path):
    import matplotlib.pyplot as plt

    from sae_lens_bae.plots import plot_firing_frequencies

    before = plt.get_fignums()
    frequencies = {"bae": torch.linspace(0, 1, 64), "topk": torch.linspace(0, 0.1, 64)}
    path = plot_firing_frequencies(frequencies, tmp_path / "firing.png")
    assert plt.get_fignums() == before
    assert matplotlib.image.imread(path).shape[2] == 4  # a real RGBA PNG
