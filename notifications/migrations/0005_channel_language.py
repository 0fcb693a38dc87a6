from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("notifications", "0004_delivery_team_due_index")]

    operations = [
        migrations.AddField(
            model_name="notificationchannel",
            name="language",
            field=models.CharField(
                choices=[("en", "English"), ("zh-hans", "简体中文")], default="en", max_length=16
            ),
        ),
    ]
