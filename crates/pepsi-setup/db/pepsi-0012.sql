-- pepsi-0012.sql: a whitelist entry may be learnt from a reply (pepsi-whitelist learn,
-- docs/whitelist.md): origin `replied`, the author of a message the mailbox's owner answered.
ALTER TABLE pepsi.whitelist DROP CONSTRAINT whitelist_origin_check;
ALTER TABLE pepsi.whitelist ADD CONSTRAINT whitelist_origin_check
    CHECK (origin IN ('owner', 'sent', 'replied'));
