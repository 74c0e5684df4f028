"""Copies of verified checkpoints on S3 storage targets, and the way back from them.

- targets: boto3 clients for a target and where objects go on it;
- policy: which verified checkpoints each target receives, and enqueueing them;
- upload: one file streamed to S3, hashed in the same pass, checksummed per part;
- replicate: one replica made and verified (called by workers.replicate);
- download: stdlib-only verified download from presigned URLs (the client uses it too);
- restore: a replica brought back to a directory.
"""
