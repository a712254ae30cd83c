/* nodelist.c - placeholder, being written. */
