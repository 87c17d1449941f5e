-- pepsi-0018.sql: a member's share of a digest when they change their delivery mode while
-- the list's digest is open (docs/lists.md, "Digests").
--
-- A digest goes to the members who take digests when it is sent. A member who switched to
-- regular delivery meanwhile would lose the posts collected before the switch, and one who
-- switched from regular would get again, in the digest, the posts they had as copies. Each
-- switch while a digest is open therefore keeps a row here: `regular` holds the positions
-- (list_digest_message.position) of the digest's posts the member gets or got as regular
-- copies, `mode` the kind of digest they last took. When the digest is sent, a member with a
-- row gets the posts not in `regular`, in their delivery mode if it is a digest's, else in
-- `mode`, and nothing when no post is left; the rows go with the digest's posts.
CREATE TABLE IF NOT EXISTS pepsi.list_digest_switch (
    digest_id  bigint NOT NULL REFERENCES pepsi.list_digest ON DELETE CASCADE,
    member_id  bigint NOT NULL REFERENCES pepsi.list_member ON DELETE CASCADE,
    mode       text NOT NULL CHECK (mode IN ('mime_digest', 'plain_digest')),
    regular    int4multirange NOT NULL,
    PRIMARY KEY (digest_id, member_id)
);
