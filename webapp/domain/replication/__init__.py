"""Copies of verified checkpoints on S3 storage targets, and the way back from them.

- storage, storage_access: the one S3 client factory, and which endpoints and credentials
  a project may use;
- targets: boto3 clients for a target and where objects go on it;
- policy: which verified checkpoints each target receives, and enqueueing them;
- sources: a checkpoint's files opened for sending (confined to the allowed roots, or
  streamed from s3://);
- fanout: a checkpoint's files sent at once within one memory budget;
- upload: one file streamed to S3, hashed in the same pass, checksummed per part;
- replicate: one replica made and verified (called by workers.replicate);
- restore: a replica brought back to a directory (lifeboat/download.py fetches and
  verifies the files; the client uses it too).
"""
