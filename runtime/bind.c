/* bind.c - placeholder, being written. */
