"""Flows that classify: class-conditional flows as classifiers.

Class posteriors by Bayes' rule (:func:`bayes_classifier`, ``K`` passes) and FlowBack's one-pass
:func:`gradient_classifier` (the gradient of the log-density in the label logits).
"""

from flows.classify.bayes import bayes_classifier
from flows.classify.gradient import gradient_classifier

__all__ = ["bayes_classifier", "gradient_classifier"]
