"""Defect models: the known numerical mistakes of attention kernels, each committed by the precision-faithful
twin, and the matching that names the one a bug's output shows (:func:`explain`)."""

from .library import BACKWARD_MODELS, FORWARD_MODELS, MODELS, DefectModel
from .matching import Explanation, Fit, explain, explain_backward, explain_forward

__all__ = ["BACKWARD_MODELS", "FORWARD_MODELS", "MODELS", "DefectModel", "Explanation", "Fit", "explain",
           "explain_backward", "explain_forward"]
