"""`peak-tune report`: one self-contained HTML page (and its PNG files) per study or
several, drawn from the study storage and the cache folder alone."""
