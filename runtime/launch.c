/* launch.c - placeholder, being written. */
