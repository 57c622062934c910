//! AF_XDP driver (in progress).
