/* Shared by the cache and its patcher; not part of the API. */
#ifndef RCACHE_INTERNAL_H
#define RCACHE_INTERNAL_H

#define RC_EXPORT_DATA __attribute__((visibility("default")))

/* rc_install_hooks patches libc's munmap and madvise entries to jump to
 * the intercepts; rc_remove_hooks puts the original bytes back. 0 or -1
 * (errno). */
int rc_install_hooks(void);
void rc_remove_hooks(void);

#endif
