"""fastshard's warning categories: each its own class, so that a user can filter exactly it."""

from __future__ import annotations


class EpochWarning(UserWarning):
    """A shuffled sampler starts a new iteration at the epoch it already yielded to its end.

    Without ``set_epoch`` (or ``auto_epoch=True``) every epoch repeats the same order, as with
    torch's ``DistributedSampler``; fastshard warns once per sampler. Code that repeats an epoch
    on purpose (a test iterating twice, say) can silence exactly this warning, also under
    ``-W error``::

        warnings.filterwarnings("ignore", category=fastshard.EpochWarning)

    Examples
    --------
    >>> import warnings
    >>> sampler = fastshard.DistributedSampler(4, num_replicas=1, rank=0)
    >>> first = list(sampler)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     second = list(sampler)  # no set_epoch in between
    >>> first == second, caught[0].category.__name__
    (True, 'EpochWarning')
    """
