"""A static feature dashboard: ``pages`` gathers what to show per feature (records, prior, logit
lens, ComSem), ``html`` renders it, ``site`` (``bae dashboard``) writes the folder."""

from sae_lens_bae.dashboard.html import feature_html, histogram_svg, index_html
from sae_lens_bae.dashboard.pages import (
    Context,
    FeaturePage,
    build_pages,
    comsem_results,
    logit_lens,
)
from sae_lens_bae.dashboard.site import DashboardConfig, dashboard

__all__ = [
    "Context",
    "DashboardConfig",
    "FeaturePage",
    "build_pages",
    "comsem_results",
    "dashboard",
    "feature_html",
    "histogram_svg",
    "index_html",
    "logit_lens",
]
