"""Reaching a node and moving bytes to it: ssh settings, paramiko and Fabric connections, the
OpenSSH push of a workspace and its SFTP fallback. No launcher and no plan here."""
