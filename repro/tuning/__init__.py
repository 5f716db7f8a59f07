"""Budget tuning: acceptance recordings and the tau per budget they imply (``repro tau``), the
measured round costs, and the fastest DDTREE budget per concurrency on this box (``repro tune``)."""
