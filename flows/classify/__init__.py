"""Flows that classify: class posteriors from class-conditional flows (:func:`bayes_classifier`)."""

from flows.classify.bayes import bayes_classifier

__all__ = ["bayes_classifier"]
