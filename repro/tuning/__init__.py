"""Budget tuning: the tau per budget that acceptance recordings (:mod:`repro.recording`) imply
(``repro tau``), the measured round costs, and the fastest DDTREE budget per concurrency on this box
(``repro tune``)."""
